"""Known mistakes of beyond sequences: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import math

import torch
import torch.nn.functional as F

from autograder.grading.judging.spec import Mistake
from solutions import beyond_sequences as ref


def _patchify_column_major(images, patch):
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // patch, patch, W // patch, patch)
    x = x.permute(0, 4, 2, 3, 5, 1)  # columns of patches outside, rows inside
    return x.reshape(B, -1, patch * patch * C)


def _patchify_channels_first(images, patch):
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // patch, patch, W // patch, patch)
    x = x.permute(0, 2, 4, 1, 3, 5)  # each patch flattened as (channel, row, column)
    return x.reshape(B, -1, patch * patch * C)


def _patchify_plain_reshape(images, patch):
    B, C = images.shape[:2]
    return images.reshape(B, -1, patch * patch * C)


class _EmbeddingClsWithoutPosition(ref.PatchEmbedding):
    def forward(self, images):
        out = super().forward(images)
        return torch.cat([out[:, :1] - self.cls_pos, out[:, 1:]], dim=1)


class _EmbeddingNoPatchPositions(ref.PatchEmbedding):
    def forward(self, images):
        tokens = self.proj(ref.patchify(images, self.patch))
        cls = (self.cls_token + self.cls_pos).expand(tokens.size(0), -1, -1)
        return torch.cat([cls, tokens], dim=1)


class _EmbeddingRowColumnSwapped(ref.PatchEmbedding):
    def forward(self, images):
        tokens = self.proj(ref.patchify(images, self.patch))
        g = self.grid
        pos = torch.cat(
            [
                self.row_pos[None, :, :].expand(g, g, -1),
                self.col_pos[:, None, :].expand(g, g, -1),
            ],
            dim=-1,
        ).reshape(g * g, -1)
        cls = (self.cls_token + self.cls_pos).expand(tokens.size(0), -1, -1)
        return torch.cat([cls, tokens + pos], dim=1)


class _EmbeddingClsLast(ref.PatchEmbedding):
    def forward(self, images):
        out = super().forward(images)
        return torch.cat([out[:, 1:], out[:, :1]], dim=1)


class _VitMeanPool(ref.VisionTransformer):
    def forward(self, images):
        x = self.embed(images)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


class _VitNoFinalNorm(ref.VisionTransformer):
    def forward(self, images):
        x = self.embed(images)
        for layer in self.layers:
            x = layer(x)
        return self.head(x[:, 0])


class _VitLastToken(ref.VisionTransformer):
    def forward(self, images):
        x = self.embed(images)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x[:, -1]))


def _wrong_gat(
    *,
    neighbours_only=True,
    self_loops=True,
    slope=None,
    leaky=True,
    order="ij",
    softmax_dim=-1,
):
    def graph_attention(h, adjacency, W, a, negative_slope=0.2):
        z = h @ W
        f_out = W.size(-1)
        first, second = (
            (a[:f_out], a[f_out:]) if order == "ij" else (a[f_out:], a[:f_out])
        )
        scores = (z @ first)[..., :, None] + (z @ second)[..., None, :]
        if leaky:
            scores = F.leaky_relu(scores, negative_slope if slope is None else slope)
        n = adjacency.size(-1)
        edges = adjacency.bool()
        if self_loops:
            edges = edges | torch.eye(n, dtype=torch.bool)
        if neighbours_only:
            scores = scores.masked_fill(~edges, float("-inf"))
        weights = torch.softmax(scores, dim=softmax_dim).nan_to_num(0.0)
        return weights @ z, weights

    return graph_attention


class _GATMeanInsteadOfConcat(ref.GATLayer):
    def forward(self, h, adjacency):
        self.concat = False
        return super().forward(h, adjacency)


class _GATConcatAlways(ref.GATLayer):
    def forward(self, h, adjacency):
        self.concat = True
        return super().forward(h, adjacency)


class _GATSharedAttention(ref.GATLayer):
    def forward(self, h, adjacency):
        outs, weights = [], []
        for W in self.W:
            out, alpha = ref.graph_attention(h, adjacency, W, self.a[0])
            outs.append(out)
            weights.append(alpha)
        weights = torch.stack(weights, dim=-3)
        if self.concat:
            return torch.cat(outs, dim=-1), weights
        return torch.stack(outs).mean(0), weights


class _GATEluInside(ref.GATLayer):
    def forward(self, h, adjacency):
        out, weights = super().forward(h, adjacency)
        return F.elu(out), weights


def _wrong_memory(
    *, softmax_dim=-1, multiply=False, sqrt_d=False, renormalise=True, use_top_k=True
):
    def memory_lookup(query, keys, values, temperature=1.0, top_k=None):
        scores = query @ keys.transpose(-2, -1)
        scores = scores * temperature if multiply else scores / temperature
        if sqrt_d:
            scores = scores / math.sqrt(query.size(-1))
        if top_k is not None and use_top_k and top_k < scores.size(-1):
            kept = scores.topk(top_k, dim=-1).indices
            keep = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, kept, True)
            if renormalise:
                weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
            else:
                weights = torch.softmax(scores, softmax_dim) * keep
        else:
            weights = torch.softmax(scores, dim=softmax_dim)
        return weights @ values, weights

    return memory_lookup


def _wrong_cross(*, scale="head", softmax_dim=-1, project_out=True, use_mask=True):
    def cross_attention(x_queries, x_context, W_q, W_k, W_v, W_o, num_heads, mask=None):
        B, n_q, _ = x_queries.shape
        n_c = x_context.size(1)
        d_model = W_q.size(-1)
        d_head = d_model // num_heads
        q = (x_queries @ W_q).reshape(B, n_q, num_heads, d_head).transpose(1, 2)
        k = (x_context @ W_k).reshape(B, n_c, num_heads, d_head).transpose(1, 2)
        v = (x_context @ W_v).reshape(B, n_c, num_heads, d_head).transpose(1, 2)
        divisor = {"head": d_head, "model": d_model, "none": 1.0}[scale]
        scores = q @ k.transpose(-2, -1) / math.sqrt(divisor)
        if mask is not None and use_mask:
            m = mask.bool()
            m = m[:, None] if m.dim() == 3 else m
            scores = scores.masked_fill(~m, float("-inf"))
        weights = torch.softmax(scores, dim=softmax_dim).nan_to_num(0.0)
        out = (weights @ v).transpose(1, 2).reshape(B, n_q, d_model)
        return (out @ W_o if project_out else out), weights

    return cross_attention


def _cross_self_attention(
    x_queries, x_context, W_q, W_k, W_v, W_o, num_heads, mask=None
):
    """Keys and values from the queries' own input (only defined when the widths agree)."""
    return ref.cross_attention(x_queries, x_queries, W_q, W_k, W_v, W_o, num_heads)


class _LatentInputAsQueries(ref.LatentAttention):
    """The roles swapped: the input attends to the latents."""

    def forward(self, x, mask=None):
        latents = self.latents.expand(x.size(0), -1, -1)
        return ref.cross_attention(
            x,
            latents,
            self.W_q.weight.T,
            self.W_k.weight.T,
            self.W_v.weight.T,
            self.W_o.weight.T,
            self.num_heads,
        )


class _LatentUnscaled(ref.LatentAttention):
    def forward(self, x, mask=None):
        return _wrong_cross(scale="none")(
            self.latents.expand(x.size(0), -1, -1),
            x,
            self.W_q.weight.T,
            self.W_k.weight.T,
            self.W_v.weight.T,
            self.W_o.weight.T,
            self.num_heads,
            None if mask is None else mask[:, None, :],
        )


class _LatentWeightsNotTransposed(ref.LatentAttention):
    """nn.Linear's weight is (out, in): x @ weight without .T projects with W^T."""

    def forward(self, x, mask=None):
        return ref.cross_attention(
            self.latents.expand(x.size(0), -1, -1),
            x,
            self.W_q.weight,
            self.W_k.weight,
            self.W_v.weight,
            self.W_o.weight,
            self.num_heads,
            None if mask is None else mask[:, None, :],
        )


class _LatentMaskIgnored(ref.LatentAttention):
    def forward(self, x, mask=None):
        return super().forward(x, None)


def _wrong_rollout(
    *, identity=True, renormalise=True, order="last_first", heads="mean"
):
    def attention_rollout(attentions, residual=True):
        rollout = None
        for layer in attentions:
            A = layer.mean(dim=1) if heads == "mean" else layer.amax(dim=1)
            if residual and identity:
                A = A + torch.eye(A.size(-1))
            if renormalise:
                A = A / A.sum(dim=-1, keepdim=True)
            if rollout is None:
                rollout = A
            else:
                rollout = A @ rollout if order == "last_first" else rollout @ A
        return rollout

    return attention_rollout


MISTAKES = [
    Mistake(
        "patchify",
        "column-major patch order",
        "your patches come in column-major order (down the first column of patches, then "
        "the next): number them row by row, patch (r, c) at index r * (W/p) + c.",
        _patchify_column_major,
    ),
    Mistake(
        "patchify",
        "channels first inside a patch",
        "each of your patches is flattened as (channel, row, column), the order F.unfold "
        "gives: flatten it as (row, column, channel), channels changing fastest.",
        _patchify_channels_first,
    ),
    Mistake(
        "patchify",
        "plain reshape",
        "your patches look like a plain reshape of the image: rows of pixels cut into "
        "pieces are not p x p squares. Split H and W into (H/p, p) and (W/p, p), then "
        "permute before flattening.",
        _patchify_plain_reshape,
    ),
    Mistake(
        "PatchEmbedding",
        "class token without a position",
        "your class token looks as if it had no positional embedding: add cls_pos to "
        "cls_token.",
        _EmbeddingClsWithoutPosition,
    ),
    Mistake(
        "PatchEmbedding",
        "no positions on the patches",
        "your patch tokens carry no position: add row_pos[r] and col_pos[c], concatenated, "
        "to the token of patch (r, c).",
        _EmbeddingNoPatchPositions,
    ),
    Mistake(
        "PatchEmbedding",
        "rows and columns swapped",
        "your positions look transposed: patch (r, c), at index r * grid + c, gets "
        "row_pos[r] in its first half and col_pos[c] in its second.",
        _EmbeddingRowColumnSwapped,
    ),
    Mistake(
        "PatchEmbedding",
        "class token last",
        "your class token seems to be at the end: put it in front, at index 0.",
        _EmbeddingClsLast,
    ),
    Mistake(
        "VisionTransformer",
        "mean pooling",
        "your logits look computed from the mean of all tokens: ViT classifies from the "
        "class token alone, x[:, 0].",
        _VitMeanPool,
    ),
    Mistake(
        "VisionTransformer",
        "no final LayerNorm",
        "your logits miss the final LayerNorm: pre-norm layers leave the residual stream "
        "unnormalised, so apply self.norm before the head.",
        _VitNoFinalNorm,
    ),
    Mistake(
        "VisionTransformer",
        "last token",
        "your logits come from the last token: the class token is the first, x[:, 0].",
        _VitLastToken,
    ),
    Mistake(
        "graph_attention",
        "softmax over all nodes",
        "every node seems to attend to every node: mask the scores of non-neighbours to "
        "-inf before the softmax, so each node's weights cover its neighbours and itself.",
        _wrong_gat(neighbours_only=False),
    ),
    Mistake(
        "graph_attention",
        "no LeakyReLU",
        "your scores look like a^T [W h_i || W h_j] without the LeakyReLU.",
        _wrong_gat(leaky=False),
    ),
    Mistake(
        "graph_attention",
        "LeakyReLU slope 0.01",
        "your LeakyReLU seems to use PyTorch's default slope 0.01: pass negative_slope "
        "(GAT uses 0.2).",
        _wrong_gat(slope=0.01),
    ),
    Mistake(
        "graph_attention",
        "LeakyReLU slope fixed at 0.2",
        "your LeakyReLU ignores the negative_slope argument.",
        _wrong_gat(slope=0.2),
    ),
    Mistake(
        "graph_attention",
        "no self-loops",
        "a node seems not to attend to itself: add self-loops, adjacency | I, before "
        "masking.",
        _wrong_gat(self_loops=False),
    ),
    Mistake(
        "graph_attention",
        "halves of a swapped",
        "your scores look like a^T [W h_j || W h_i]: the first half of a multiplies the "
        "attending node i, the second half the neighbour j.",
        _wrong_gat(order="ji"),
    ),
    Mistake(
        "graph_attention",
        "softmax over the wrong axis",
        "your weights are normalised down the columns: take the softmax over each node's "
        "neighbours, dim=-1, so that every row sums to 1.",
        _wrong_gat(softmax_dim=-2),
    ),
    Mistake(
        "GATLayer",
        "heads averaged instead of concatenated",
        "with concat=True, concatenate the K heads' outputs along the features.",
        _GATMeanInsteadOfConcat,
    ),
    Mistake(
        "GATLayer",
        "heads concatenated instead of averaged",
        "with concat=False, average the K heads' outputs.",
        _GATConcatAlways,
    ),
    Mistake(
        "GATLayer",
        "one attention vector for all heads",
        "your heads seem to share one attention vector: head k uses W[k] and a[k].",
        _GATSharedAttention,
    ),
    Mistake(
        "GATLayer",
        "nonlinearity inside",
        "your output looks passed through an ELU: GATLayer returns the heads' raw outputs; "
        "the model applies the nonlinearity.",
        _GATEluInside,
    ),
    Mistake(
        "memory_lookup",
        "softmax over the wrong axis",
        "your weights are normalised over the queries: take the softmax over the memory "
        "slots, dim=-1, so that each query's weights sum to 1.",
        _wrong_memory(softmax_dim=-2),
    ),
    Mistake(
        "memory_lookup",
        "temperature multiplied",
        "your scores look multiplied by the temperature: divide by it (a low temperature "
        "sharpens the lookup).",
        _wrong_memory(multiply=True),
    ),
    Mistake(
        "memory_lookup",
        "scaled by sqrt(d)",
        "your scores look divided by sqrt(d) too: the memory read divides by the "
        "temperature only.",
        _wrong_memory(sqrt_d=True),
    ),
    Mistake(
        "memory_lookup",
        "top-k not renormalised",
        "with top_k your kept weights do not sum to 1: mask the other slots before the "
        "softmax, not after it.",
        _wrong_memory(renormalise=False),
    ),
    Mistake(
        "memory_lookup",
        "top_k ignored",
        "with top_k your read still uses every slot: keep the top_k largest scores only.",
        _wrong_memory(use_top_k=False),
    ),
    Mistake(
        "cross_attention",
        "unscaled",
        "your scores look unscaled: divide by sqrt(d_head), d_head = d_model / num_heads.",
        _wrong_cross(scale="none"),
    ),
    Mistake(
        "cross_attention",
        "scaled by sqrt(d_model)",
        "your scores look divided by sqrt(d_model): each head divides by sqrt(d_head).",
        _wrong_cross(scale="model"),
    ),
    Mistake(
        "cross_attention",
        "softmax over the queries",
        "your weights are normalised over the queries: take the softmax over the context "
        "(dim=-1).",
        _wrong_cross(softmax_dim=-2),
    ),
    Mistake(
        "cross_attention",
        "no output projection",
        "your output misses W_o: concatenate the heads, then multiply by W_o.",
        _wrong_cross(project_out=False),
    ),
    Mistake(
        "cross_attention",
        "mask ignored",
        "your output ignores the mask: hide the context positions where it is False.",
        _wrong_cross(use_mask=False),
    ),
    Mistake(
        "cross_attention",
        "keys and values from the queries",
        "your keys and values seem to come from x_queries: in cross-attention they come "
        "from x_context.",
        _cross_self_attention,
    ),
    Mistake(
        "LatentAttention",
        "roles swapped",
        "your output has one row per input token: the latents are the queries and the "
        "input gives the keys and values, so the output has num_latents rows.",
        _LatentInputAsQueries,
    ),
    Mistake(
        "LatentAttention",
        "unscaled",
        "your scores look unscaled: divide by sqrt(d_head).",
        _LatentUnscaled,
    ),
    Mistake(
        "LatentAttention",
        "nn.Linear weights not transposed",
        "your projections look transposed: nn.Linear's weight is (out, in), so x @ W "
        "needs W = linear.weight.T (or call the linear layer).",
        _LatentWeightsNotTransposed,
    ),
    Mistake(
        "LatentAttention",
        "mask ignored",
        "your output ignores the padding mask: pass it on as a (B, 1, n) mask.",
        _LatentMaskIgnored,
    ),
    Mistake(
        "attention_rollout",
        "no residual identity",
        "with residual=True, add the identity to each layer's head-averaged weights "
        "(the residual connection carries every token to itself).",
        _wrong_rollout(identity=False),
    ),
    Mistake(
        "attention_rollout",
        "not renormalised",
        "your rows sum to more than 1: after adding the identity, divide each row by its "
        "sum.",
        _wrong_rollout(renormalise=False),
    ),
    Mistake(
        "attention_rollout",
        "layers multiplied in the wrong order",
        "your product looks reversed: the rollout after layer l is A_l times the rollout "
        "after layer l - 1, A_L ... A_2 A_1.",
        _wrong_rollout(order="first_first"),
    ),
    Mistake(
        "attention_rollout",
        "max over heads",
        "your heads look combined by a maximum: average them.",
        _wrong_rollout(heads="max"),
    ),
]

"""Reference implementations for chapter 9, attention beyond sequences: images (ViT), graphs
(GAT), memories, other modalities (cross-attention, Perceiver latents), attention rollout."""

# ruff: noqa: N803, N806  (W, a, ... are the papers' names)

import math

import torch
import torch.nn.functional as F
from torch import nn

# ------------------------------------------------------------- given in the notebook


class MHA(nn.MultiheadAttention):
    """PyTorch's multi-head attention (chapter 4), called with the course's mask convention."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0):
        super().__init__(d_model, num_heads, dropout=dropout, batch_first=True)
        self.weights = None  # the last attention weights (B, h, n_q, n_k), for plots

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn_mask = None
        if mask is not None:
            batch, n_q, n_k = query.size(0), query.size(1), key.size(1)
            # Ours: True = may attend. PyTorch's boolean attn_mask: True = may NOT attend,
            # shape (n_q, n_k) or (B * h, n_q, n_k) with the heads of one sequence adjacent.
            attn_mask = ~mask.expand(batch, n_q, n_k)
            attn_mask = attn_mask.repeat_interleave(self.num_heads, dim=0)
        out, weights = super().forward(
            query,
            key,
            value,
            attn_mask=attn_mask,
            need_weights=True,
            average_attn_weights=False,
        )
        self.weights = weights.detach()
        return out, weights  # (B, n_q, d_model), (B, h, n_q, n_k)


class EncoderLayer(nn.Module):
    """Chapter 6's pre-norm encoder layer: x + MHA(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = MHA(d_model, num_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        y = self.norm1(x)
        x = x + self.dropout(self.self_attn(y, y, y, mask)[0])
        y = self.linear2(self.dropout(torch.relu(self.linear1(self.norm2(x)))))
        return x + self.dropout(y)  # (B, n, d_model)


# ------------------------------------------------------------------------------ exercises


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, (H/p)(W/p), p*p*C): patches in row-major order, each flattened
    as (row in patch, column in patch, channel)."""
    B, C, H, W = images.shape
    rows, cols = H // patch, W // patch
    x = images.reshape(B, C, rows, patch, cols, patch)
    x = x.permute(0, 2, 4, 3, 5, 1)  # (B, rows, cols, p, p, C)
    return x.reshape(B, rows * cols, patch * patch * C)


class PatchEmbedding(nn.Module):
    """Patches -> tokens, a class token in front, 2-D positional embeddings added."""

    def __init__(self, image_size: int, patch: int, channels: int, d_model: int):
        super().__init__()
        self.patch = patch
        self.grid = image_size // patch
        self.proj = nn.Linear(patch * patch * channels, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.cls_pos = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)
        self.row_pos = nn.Parameter(torch.randn(self.grid, d_model // 2) * 0.02)
        self.col_pos = nn.Parameter(
            torch.randn(self.grid, d_model - d_model // 2) * 0.02
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(patchify(images, self.patch))  # (B, N, d_model)
        g = self.grid
        pos = torch.cat(
            [
                self.row_pos[:, None, :].expand(
                    g, g, -1
                ),  # patch (r, c) gets row_pos[r]
                self.col_pos[None, :, :].expand(g, g, -1),  # ... and col_pos[c]
            ],
            dim=-1,
        ).reshape(g * g, -1)  # (N, d_model), row-major like the patches
        cls = (self.cls_token + self.cls_pos).expand(tokens.size(0), -1, -1)
        return torch.cat([cls, tokens + pos], dim=1)  # (B, 1 + N, d_model)


class VisionTransformer(nn.Module):
    """PatchEmbedding, pre-norm encoder layers, a final LayerNorm, a linear head on the
    class token."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        channels: int,
        num_classes: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        d_ff: int,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.embed = PatchEmbedding(image_size, patch, channels, d_model)
        self.layers = nn.ModuleList(
            [EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)]
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images)  # (B, 1 + N, d_model)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x[:, 0]))  # (B, num_classes), from the class token


def graph_attention(
    h: torch.Tensor,
    adjacency: torch.Tensor,
    W: torch.Tensor,
    a: torch.Tensor,
    negative_slope: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One GAT head: e_ij = LeakyReLU(a^T [W h_i || W h_j]) on the edges j -> i and i -> i,
    softmax over each node's neighbours; returns (sum_j alpha_ij W h_j, alpha)."""
    z = h @ W  # (..., N, F_out)
    f_out = W.size(-1)
    source = z @ a[:f_out]  # (..., N): a_1 . W h_i, the attending node
    target = z @ a[f_out:]  # (..., N): a_2 . W h_j, the neighbour
    scores = F.leaky_relu(source[..., :, None] + target[..., None, :], negative_slope)
    n = adjacency.size(-1)
    edges = adjacency.bool() | torch.eye(n, dtype=torch.bool, device=h.device)
    scores = scores.masked_fill(~edges, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., N, N), rows over neighbours
    return weights @ z, weights


class GATLayer(nn.Module):
    """Multi-head graph attention: K heads, each graph_attention with its own W and a;
    the heads' outputs concatenated (concat=True) or averaged (concat=False)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_heads: int,
        concat: bool = True,
        negative_slope: float = 0.2,
    ):
        super().__init__()
        self.W = nn.Parameter(torch.empty(num_heads, in_features, out_features))
        self.a = nn.Parameter(torch.empty(num_heads, 2 * out_features))
        with torch.no_grad():  # each head a Xavier-uniform layer of its own
            for k in range(num_heads):
                nn.init.xavier_uniform_(self.W[k])  # fans in_features, out_features
                nn.init.xavier_uniform_(self.a[k, :, None])  # a (2 F_out, 1) column
        self.concat = concat
        self.negative_slope = negative_slope

    def forward(self, h: torch.Tensor, adjacency: torch.Tensor):
        outs, weights = [], []
        for W, a in zip(self.W, self.a, strict=True):
            out, alpha = graph_attention(h, adjacency, W, a, self.negative_slope)
            outs.append(out)
            weights.append(alpha)
        weights = torch.stack(weights, dim=-3)  # (..., K, N, N)
        if self.concat:
            return torch.cat(outs, dim=-1), weights  # (..., N, K * F_out)
        return torch.stack(outs).mean(0), weights  # (..., N, F_out)


def memory_lookup(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A key-value memory read: softmax(q . k_i / temperature) over the m slots, restricted to
    the top_k largest scores when top_k is given."""
    scores = query @ keys.transpose(-2, -1) / temperature  # (..., n_q, m)
    if top_k is not None and top_k < scores.size(-1):
        kept = scores.topk(top_k, dim=-1).indices
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, kept, True)
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ values, weights  # (..., n_q, d_v), (..., n_q, m)


def cross_attention(
    x_queries: torch.Tensor,
    x_context: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    W_v: torch.Tensor,
    W_o: torch.Tensor,
    num_heads: int,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head attention with queries from x_queries and keys and values from x_context."""
    B, n_q, _ = x_queries.shape
    n_c = x_context.size(1)
    d_model = W_q.size(-1)
    d_head = d_model // num_heads

    def heads(x, n):  # (B, n, d_model) -> (B, h, n, d_head)
        return x.reshape(B, n, num_heads, d_head).transpose(1, 2)

    q = heads(x_queries @ W_q, n_q)
    k = heads(x_context @ W_k, n_c)
    v = heads(x_context @ W_v, n_c)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (B, h, n_q, n_c)
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        mask = mask.bool()
        if mask.dim() == 3:
            mask = mask[:, None]  # the same mask for every head
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        weights = weights.nan_to_num(0.0)  # a query that may attend to nothing
    out = (weights @ v).transpose(1, 2).reshape(B, n_q, d_model)
    return out @ W_o, weights  # (B, n_q, d_out), (B, h, n_q, n_c)


class LatentAttention(nn.Module):
    """A Perceiver-style read: num_latents learned queries cross-attend to a long input."""

    def __init__(self, num_latents: int, d_model: int, num_heads: int):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(num_latents, d_model) * 0.02)
        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, d_model, bias=False)
        self.W_v = nn.Linear(d_model, d_model, bias=False)
        self.W_o = nn.Linear(d_model, d_model, bias=False)
        self.num_heads = num_heads

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        queries = self.latents.expand(x.size(0), -1, -1)  # (B, m, d_model)
        # a padding mask (B, n) becomes (B, 1, n): the same keys for every latent
        mask = None if mask is None else mask[:, None, :]
        return cross_attention(
            queries,
            x,
            self.W_q.weight.T,
            self.W_k.weight.T,
            self.W_v.weight.T,
            self.W_o.weight.T,
            num_heads=self.num_heads,
            mask=mask,
        )


def attention_rollout(attentions: torch.Tensor, residual: bool = True) -> torch.Tensor:
    """Abnar and Zuidema (2020): (L, B, h, n, n) -> (B, n, n). Per layer, the head average,
    plus the identity for the residual connection, rows renormalised; then the product
    A_L ... A_2 A_1 through the layers."""
    rollout = None
    for layer in attentions:  # from the first layer up
        A = layer.mean(dim=1)  # (B, n, n)
        if residual:
            A = A + torch.eye(A.size(-1), dtype=A.dtype, device=A.device)
        A = A / A.sum(dim=-1, keepdim=True)
        rollout = A if rollout is None else A @ rollout
    return rollout

"""Chapter 9, beyond sequences: the references against PyTorch and the papers' formulas, the
notebook's given helpers against the references', and the hidden tests against answers written
independently of them."""

# ruff: noqa: N803, N806  (W, a, ... are the papers' names)

import math

import jupytext
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder import paths
from solutions import beyond_sequences as bs
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    wrong_answers,
)

CHAPTER = "09_beyond_sequences"


# ------------------------------------------------------------------ images (ViT)


@pytest.mark.parametrize(
    "shape, patch",
    [((2, 3, 8, 12), 4), ((1, 1, 6, 6), 2), ((3, 2, 9, 6), 3), ((2, 3, 4, 4), 4)],
)
def test_patchify_equals_unfold_reordered_and_an_explicit_loop(shape, patch):
    torch.manual_seed(0)
    images = torch.randn(*shape)
    B, C, H, W = shape
    out = bs.patchify(images, patch)
    # F.unfold: (B, C * p * p, N), patches in row-major order, each as (channel, row, column)
    unfolded = F.unfold(images, kernel_size=patch, stride=patch)
    expected = (
        unfolded.reshape(B, C, patch, patch, -1)
        .permute(0, 4, 2, 3, 1)
        .reshape(B, -1, patch * patch * C)
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    cols = W // patch
    for r in range(H // patch):
        for c in range(cols):
            for i in range(patch):
                for j in range(patch):
                    for ch in range(C):
                        assert torch.equal(
                            out[:, r * cols + c, (i * patch + j) * C + ch],
                            images[:, ch, r * patch + i, c * patch + j],
                        )


def test_patch_embedding_lays_out_the_class_token_and_2d_positions():
    torch.manual_seed(1)
    embed = bs.PatchEmbedding(image_size=6, patch=2, channels=3, d_model=10)
    with torch.no_grad():
        for p in embed.parameters():
            p.normal_()
    images = torch.randn(2, 3, 6, 6)
    tokens = embed(images)
    assert tokens.shape == (2, 10, 10)
    torch.testing.assert_close(
        tokens[:, 0], (embed.cls_token + embed.cls_pos)[0, 0].expand(2, -1)
    )
    patches = bs.patchify(images, 2)
    for r in range(3):
        for c in range(3):
            expected = embed.proj(patches[:, 3 * r + c]) + torch.cat(
                [embed.row_pos[r], embed.col_pos[c]]
            )
            torch.testing.assert_close(tokens[:, 1 + 3 * r + c], expected)


def _helper_namespace():
    """The notebook's given helper cell (MHA, EncoderLayer), executed on its own."""
    nb = jupytext.read(paths.chapter_source(CHAPTER))
    (cell,) = [
        c
        for c in nb.cells
        if c.cell_type == "code" and "class EncoderLayer" in c.source
    ]
    namespace = {"torch": torch, "nn": nn}
    exec(cell.source, namespace)
    return namespace


def test_the_given_encoder_layer_is_pytorchs_pre_norm_layer_and_the_references():
    torch.manual_seed(2)
    given = _helper_namespace()["EncoderLayer"](16, 4, 32)
    reference = bs.EncoderLayer(16, 4, 32)
    reference.load_state_dict(given.state_dict())
    torch_layer = nn.TransformerEncoderLayer(
        16, 4, 32, dropout=0.0, batch_first=True, norm_first=True
    )
    torch_layer.self_attn.load_state_dict(given.self_attn.state_dict())
    for name in ("norm1", "norm2", "linear1", "linear2"):
        getattr(torch_layer, name).load_state_dict(getattr(given, name).state_dict())
    x = torch.randn(3, 7, 16)
    keep = torch.ones(3, 1, 7, dtype=torch.bool)
    keep[1, :, 5:] = False
    for layer in (given, reference, torch_layer):
        layer.eval()
    expected = torch_layer(x, src_key_padding_mask=~keep[:, 0])
    torch.testing.assert_close(given(x, keep), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(reference(x, keep), expected, rtol=1e-4, atol=1e-5)
    assert given.self_attn.weights.shape == (3, 4, 7, 7)


def test_vision_transformer_classifies_from_the_class_token():
    torch.manual_seed(3)
    vit = bs.VisionTransformer(8, 2, 1, 10, 16, 2, 2, 32).eval()
    images = torch.randn(4, 1, 8, 8)
    x = vit.embed(images)
    for layer in vit.layers:
        x = layer(x)
    torch.testing.assert_close(vit(images), vit.head(vit.norm(x[:, 0])))
    # the patches' positions matter: shuffling the patches changes the prediction
    shuffled = images.flip(-1)
    assert not torch.allclose(vit(shuffled), vit(images))


# ------------------------------------------------------------------------- graphs


def _gat_by_edges(h, adjacency, W, a, negative_slope=0.2):
    """GAT's equations (Velickovic et al., 2018, eq. 1-4), one edge at a time, float64."""
    h, W, a = h.double(), W.double(), a.double()
    N, f_out = adjacency.size(0), W.size(1)
    out = torch.zeros(*h.shape[:-1], f_out, dtype=torch.float64)
    weights = torch.zeros(*h.shape[:-2], N, N, dtype=torch.float64)
    for i in range(N):
        neighbours = [j for j in range(N) if adjacency[i, j] or i == j]
        e = torch.stack(
            [
                F.leaky_relu(
                    torch.cat([h[..., i, :] @ W, h[..., j, :] @ W], -1) @ a,
                    negative_slope,
                )
                for j in neighbours
            ],
            -1,
        )
        alpha = torch.softmax(e, -1)
        for t, j in enumerate(neighbours):
            weights[..., i, j] = alpha[..., t]
            out[..., i, :] += alpha[..., t, None] * (h[..., j, :] @ W)
    return out, weights


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("slope", [0.2, 0.05])
def test_graph_attention_equals_the_papers_equations_edge_by_edge(symmetric, slope):
    torch.manual_seed(4)
    N = 8
    adjacency = torch.rand(N, N) < 0.3
    if symmetric:
        adjacency = adjacency | adjacency.T
    adjacency[0] = False  # an isolated node: it attends to itself only
    adjacency[:, 0] = False
    h, W, a = torch.randn(2, N, 5), torch.randn(5, 3), torch.randn(6)
    out, weights = bs.graph_attention(h, adjacency, W, a, slope)
    expected_out, expected_weights = _gat_by_edges(h, adjacency, W, a, slope)
    torch.testing.assert_close(out.double(), expected_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.double(), expected_weights, rtol=1e-5, atol=1e-6)
    assert torch.equal(weights[:, 0], torch.eye(N)[0].expand(2, -1))


def test_gat_layer_concatenates_or_averages_its_heads():
    torch.manual_seed(5)
    layer = bs.GATLayer(5, 3, 4)
    h, adjacency = torch.randn(7, 5), torch.rand(7, 7) < 0.4
    out, weights = layer(h, adjacency)
    heads = [bs.graph_attention(h, adjacency, layer.W[k], layer.a[k]) for k in range(4)]
    torch.testing.assert_close(out, torch.cat([o for o, _ in heads], -1))
    torch.testing.assert_close(weights, torch.stack([w for _, w in heads]))
    layer.concat = False
    out, _ = layer(h, adjacency)
    torch.testing.assert_close(out, torch.stack([o for o, _ in heads]).mean(0))


def test_gat_layer_initialises_each_head_as_its_own_xavier_uniform_layer():
    """The docstring's contract: W[k] uniform in +-sqrt(6 / (F_in + F_out)), a[k] (as a
    (2 F_out, 1) column) in +-sqrt(6 / (2 F_out + 1)), not the fans of the 3-D tensor."""
    torch.manual_seed(11)
    F_in, F_out, K = 34, 8, 4
    layer = bs.GATLayer(F_in, F_out, K)
    w_bound, a_bound = math.sqrt(6 / (F_in + F_out)), math.sqrt(6 / (2 * F_out + 1))
    assert layer.W.abs().max() <= w_bound
    assert layer.a.abs().max() <= a_bound
    # the draws fill the range: uniform over +-bound, not a narrower one
    assert layer.W.abs().max() > 0.95 * w_bound
    assert layer.a.abs().max() > 0.8 * a_bound
    assert layer.W.is_leaf and layer.a.is_leaf


# ------------------------------------------------------------------------- memory


def test_memory_lookup_is_a_tempered_softmax_read_and_its_limits():
    torch.manual_seed(6)
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 5)
    for tau in (0.3, 1.0, 5.0):
        out, weights = bs.memory_lookup(q, k, v, temperature=tau)
        expected = torch.softmax(q @ k.transpose(-2, -1) / tau, -1)
        torch.testing.assert_close(weights, expected)
        torch.testing.assert_close(out, expected @ v)
    # tau -> 0: the hard lookup v[argmax]; tau -> infinity: the mean of the values
    out, _ = bs.memory_lookup(q, k, v, temperature=1e-4)
    best = (q @ k.transpose(-2, -1)).argmax(-1)
    torch.testing.assert_close(out, torch.stack([v[b, best[b]] for b in range(2)]))
    out, _ = bs.memory_lookup(q, k, v, temperature=1e6)
    torch.testing.assert_close(
        out, v.mean(-2, keepdim=True).expand(2, 3, 5), atol=1e-4, rtol=0
    )


def test_memory_lookup_top_k_renormalises_over_the_best_slots():
    torch.manual_seed(7)
    q, k, v = torch.randn(4, 6), torch.randn(9, 6), torch.randn(9, 2)
    scores = q @ k.T
    for top_k in (1, 3, 9, 20):
        out, weights = bs.memory_lookup(q, k, v, top_k=top_k)
        kept = scores.topk(min(top_k, 9), -1)
        expected = torch.zeros(4, 9).scatter(
            -1, kept.indices, torch.softmax(kept.values, -1)
        )
        torch.testing.assert_close(weights, expected)
        torch.testing.assert_close(out, expected @ v)


# ---------------------------------------------------------------------- modalities


def test_cross_attention_equals_multihead_attention_with_kdim_and_vdim():
    torch.manual_seed(8)
    d_q, d_c, heads = 12, 7, 3
    mha = nn.MultiheadAttention(
        d_q, heads, bias=False, kdim=d_c, vdim=d_c, batch_first=True
    )
    x_q, x_c = torch.randn(2, 5, d_q), torch.randn(2, 9, d_c)
    keep = torch.rand(2, 9) < 0.6
    keep[:, 0] = True
    weights_of = (
        mha.q_proj_weight.T,
        mha.k_proj_weight.T,
        mha.v_proj_weight.T,
        mha.out_proj.weight.T,
    )
    for mask in (None, keep):
        out, weights = bs.cross_attention(
            x_q, x_c, *weights_of, heads, None if mask is None else mask[:, None, :]
        )
        expected, expected_weights = mha(
            x_q,
            x_c,
            x_c,
            key_padding_mask=None if mask is None else ~mask,
            average_attn_weights=False,
        )
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(weights, expected_weights, rtol=1e-4, atol=1e-6)


def test_cross_attention_with_a_model_width_of_its_own_is_a_loop_over_heads():
    torch.manual_seed(9)
    x_q, x_c = torch.randn(2, 4, 6), torch.randn(2, 7, 10)
    W_q, W_k, W_v, W_o = (
        torch.randn(6, 12),
        torch.randn(10, 12),
        torch.randn(10, 12),
        torch.randn(12, 6),
    )
    out, weights = bs.cross_attention(x_q, x_c, W_q, W_k, W_v, W_o, 3)
    heads = []
    for i in range(3):
        cols = slice(4 * i, 4 * i + 4)
        alpha = torch.softmax(
            (x_q @ W_q[:, cols]) @ (x_c @ W_k[:, cols]).transpose(1, 2) / 2.0, -1
        )
        torch.testing.assert_close(weights[:, i], alpha)
        heads.append(alpha @ (x_c @ W_v[:, cols]))
    torch.testing.assert_close(out, torch.cat(heads, -1) @ W_o, rtol=1e-4, atol=1e-4)
    # a query that may attend to nothing gets zero weights, not NaN
    mask = torch.ones(2, 4, 7, dtype=torch.bool)
    mask[0, 1] = False
    out, weights = bs.cross_attention(x_q, x_c, W_q, W_k, W_v, W_o, 3, mask)
    assert torch.equal(weights[0, :, 1], torch.zeros(3, 7))
    assert torch.isfinite(out).all()


def test_latent_attention_equals_multihead_attention_with_the_latents_as_queries():
    torch.manual_seed(10)
    latent = bs.LatentAttention(5, 8, 2)
    mha = nn.MultiheadAttention(8, 2, bias=False, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(
            torch.cat([latent.W_q.weight, latent.W_k.weight, latent.W_v.weight])
        )
        mha.out_proj.weight.copy_(latent.W_o.weight)
    x = torch.randn(3, 40, 8)
    keep = torch.ones(3, 40, dtype=torch.bool)
    keep[2, 25:] = False
    out, weights = latent(x, keep)
    expected, expected_weights = mha(
        latent.latents.expand(3, -1, -1),
        x,
        x,
        key_padding_mask=~keep,
        average_attn_weights=False,
    )
    assert out.shape == (3, 5, 8) and weights.shape == (3, 2, 5, 40)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------- rollout


def test_attention_rollout_is_abnar_and_zuidemas_recursion():
    torch.manual_seed(11)
    attentions = torch.softmax(torch.randn(4, 2, 3, 6, 6) * 2, -1)
    # Abnar and Zuidema (2020): A~ = 0.5 W_att + 0.5 I, rollout(l_i) = A~(l_i) rollout(l_{i-1})
    rollout = 0.5 * attentions[0].mean(1) + 0.5 * torch.eye(6)
    for layer in attentions[1:]:
        rollout = (0.5 * layer.mean(1) + 0.5 * torch.eye(6)) @ rollout
    torch.testing.assert_close(bs.attention_rollout(attentions), rollout)
    plain = (
        attentions[3].mean(1)
        @ attentions[2].mean(1)
        @ attentions[1].mean(1)
        @ attentions[0].mean(1)
    )
    torch.testing.assert_close(bs.attention_rollout(attentions, residual=False), plain)
    torch.testing.assert_close(
        bs.attention_rollout(attentions).sum(-1), torch.ones(2, 6)
    )


# ---------------------------------------------------------------------- the notebook


def test_the_student_notebook_installs_scikit_learn_and_networkx_on_colab():
    nb = jupytext.read(paths.release_notebook(CHAPTER))
    setup = next(c for c in nb.cells if c.cell_type == "code").source
    assert "google.colab" in setup
    assert '"sklearn": "scikit-learn==' in setup
    assert '"networkx": "networkx==' in setup


# ------------------------------------------------- hidden tests: independent answers


def _patchify_unfold_not_transposed(images, patch):
    return F.unfold(images, patch, stride=patch)  # (B, C p p, N)


def _patchify_unfold_channels_first(images, patch):
    return F.unfold(images, patch, stride=patch).transpose(1, 2)


def _patchify_overlapping(images, patch):
    """Patches every pixel, stride 1, as a convolution would see them."""
    B, C = images.shape[:2]
    out = F.unfold(images, patch, stride=1).transpose(1, 2)
    return out.reshape(B, out.size(1), C, patch * patch).transpose(2, 3).flatten(2)


class _EmbeddingPositionsShifted(bs.PatchEmbedding):
    """The position table read from index 0 for the whole sequence, class token included."""

    def forward(self, images):
        tokens = self.proj(bs.patchify(images, self.patch))
        g = self.grid
        pos = torch.cat(
            [
                self.row_pos[:, None].expand(g, g, -1),
                self.col_pos[None].expand(g, g, -1),
            ],
            -1,
        ).reshape(g * g, -1)
        x = torch.cat([self.cls_token.expand(tokens.size(0), -1, -1), tokens], 1)
        return x + torch.cat([pos, self.cls_pos[0]], 0)


class _EmbeddingLayerNormed(bs.PatchEmbedding):
    def forward(self, images):
        out = super().forward(images)
        return F.layer_norm(out, out.shape[-1:])


class _VitPostNorm(bs.VisionTransformer):
    """Chapter 6's post-norm order with the same weights."""

    def forward(self, images):
        x = self.embed(images)
        for layer in self.layers:
            x = layer.norm1(x + layer.self_attn(x, x, x)[0])
            x = layer.norm2(x + layer.linear2(torch.relu(layer.linear1(x))))
        return self.head(self.norm(x[:, 0]))


class _VitSoftmaxed(bs.VisionTransformer):
    def forward(self, images):
        return torch.softmax(super().forward(images), -1)


def _gat_tanh(h, adjacency, W, a, negative_slope=0.2):
    """Chapter 2's additive score, tanh in place of the LeakyReLU."""
    z = h @ W
    f = W.size(1)
    scores = torch.tanh((z @ a[:f])[..., :, None] + (z @ a[f:])[..., None, :])
    edges = adjacency | torch.eye(adjacency.size(0), dtype=torch.bool)
    weights = torch.softmax(scores.masked_fill(~edges, float("-inf")), -1)
    return weights @ z, weights


def _gat_masked_after_softmax(h, adjacency, W, a, negative_slope=0.2):
    z = h @ W
    f = W.size(1)
    scores = F.leaky_relu(
        (z @ a[:f])[..., :, None] + (z @ a[f:])[..., None, :], negative_slope
    )
    edges = adjacency | torch.eye(adjacency.size(0), dtype=torch.bool)
    weights = torch.softmax(scores, -1) * edges
    return weights @ z, weights


def _gat_transposed_adjacency(h, adjacency, W, a, negative_slope=0.2):
    return bs.graph_attention(h, adjacency.T, W, a, negative_slope)


class _GATHeadsReversed(bs.GATLayer):
    def forward(self, h, adjacency):
        out, weights = super().forward(h, adjacency)
        if not self.concat:
            return out, weights
        return torch.cat(out.chunk(self.W.size(0), -1)[::-1], -1), weights


class _GATNoWeights(bs.GATLayer):
    def forward(self, h, adjacency):
        return super().forward(h, adjacency)[0]


def _memory_hard_always(query, keys, values, temperature=1.0, top_k=None):
    scores = query @ keys.transpose(-2, -1)
    weights = F.one_hot(scores.argmax(-1), scores.size(-1)).float()
    return weights @ values, weights


def _memory_weights_transposed(query, keys, values, temperature=1.0, top_k=None):
    out, weights = bs.memory_lookup(query, keys, values, temperature, top_k)
    return out, weights.transpose(-2, -1)


def _cross_heads_interleaved(
    x_queries, x_context, W_q, W_k, W_v, W_o, num_heads, mask=None
):
    """Head i takes every h-th column instead of a block of d_head columns."""
    d_model = W_q.size(1)
    order = torch.arange(d_model).reshape(-1, num_heads).T.flatten()
    return bs.cross_attention(
        x_queries,
        x_context,
        W_q[:, order],
        W_k[:, order],
        W_v[:, order],
        W_o,
        num_heads,
        mask,
    )


def _cross_mask_inverted(
    x_queries, x_context, W_q, W_k, W_v, W_o, num_heads, mask=None
):
    return bs.cross_attention(
        x_queries,
        x_context,
        W_q,
        W_k,
        W_v,
        W_o,
        num_heads,
        None if mask is None else ~mask,
    )


class _LatentLayerNormed(bs.LatentAttention):
    def forward(self, x, mask=None):
        out, weights = super().forward(F.layer_norm(x, x.shape[-1:]), mask)
        return out, weights


class _LatentWithResidual(bs.LatentAttention):
    def forward(self, x, mask=None):
        out, weights = super().forward(x, mask)
        return out + self.latents, weights


def _rollout_sum(attentions, residual=True):
    A = attentions.mean(2)
    if residual:
        A = (A + torch.eye(A.size(-1))) / 2
    return A.sum(0) / A.size(0)


def _rollout_last_layer(attentions, residual=True):
    return bs.attention_rollout(attentions[-1:], residual)


INDEPENDENT_WRONG_ANSWERS = {
    "patchify": {
        _patchify_unfold_not_transposed: ["bs_patchify"],
        _patchify_unfold_channels_first: ["bs_patchify"],
        _patchify_overlapping: ["bs_patchify"],
    },
    "PatchEmbedding": {
        _EmbeddingPositionsShifted: ["bs_patch_embedding"],
        _EmbeddingLayerNormed: ["bs_patch_embedding"],
    },
    "VisionTransformer": {
        _VitPostNorm: ["bs_vit"],
        _VitSoftmaxed: ["bs_vit"],
    },
    "graph_attention": {
        _gat_tanh: ["bs_graph_attention"],
        _gat_masked_after_softmax: ["bs_graph_attention"],
        _gat_transposed_adjacency: ["bs_graph_attention"],
    },
    "GATLayer": {
        _GATHeadsReversed: ["bs_gat_layer"],
        _GATNoWeights: ["bs_gat_layer"],
    },
    "memory_lookup": {
        _memory_hard_always: ["bs_memory", "bs_memory_top_k"],
        _memory_weights_transposed: ["bs_memory", "bs_memory_top_k"],
    },
    "cross_attention": {
        _cross_heads_interleaved: ["bs_cross_attention"],
        _cross_mask_inverted: ["bs_cross_attention"],
    },
    "LatentAttention": {
        _LatentLayerNormed: ["bs_latent_attention"],
        _LatentWithResidual: ["bs_latent_attention"],
    },
    "attention_rollout": {
        _rollout_sum: ["bs_rollout"],
        _rollout_last_layer: ["bs_rollout"],
    },
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails(CHAPTER, bs, exercise, wrong, test_ids)


def _patchify_by_loops(images, patch):
    B, C, H, W = images.shape
    rows = []
    for r in range(H // patch):
        for c in range(W // patch):
            block = images[
                :, :, r * patch : (r + 1) * patch, c * patch : (c + 1) * patch
            ]
            rows.append(block.permute(0, 2, 3, 1).reshape(B, -1))
    return torch.stack(rows, 1)


class _EmbeddingByIndex(bs.PatchEmbedding):
    def forward(self, images):
        tokens = bs.patchify(images, self.patch) @ self.proj.weight.T + self.proj.bias
        index = torch.arange(self.grid * self.grid)
        pos = torch.cat(
            [self.row_pos[index // self.grid], self.col_pos[index % self.grid]], -1
        )
        cls = self.cls_token[0] + self.cls_pos[0]  # (1, d_model)
        return torch.cat([cls.expand(len(images), 1, -1), tokens + pos], 1)


class _VitFunctional(bs.VisionTransformer):
    def forward(self, images):
        x = self.embed(images)
        for layer in self.layers:
            x = layer(x)
        cls = F.layer_norm(
            x[:, 0], x.shape[-1:], self.norm.weight, self.norm.bias, self.norm.eps
        )
        return F.linear(cls, self.head.weight, self.head.bias)


def _gat_edges_float64(h, adjacency, W, a, negative_slope=0.2):
    out, weights = _gat_by_edges(h, adjacency, W, a, negative_slope)
    return out.float(), weights.float()


class _GATEinsum(bs.GATLayer):
    def forward(self, h, adjacency):
        z = torch.einsum("...nf,kfo->...kno", h, self.W)  # (..., K, N, F_out)
        f = self.W.size(-1)
        source = torch.einsum("...kno,ko->...kn", z, self.a[:, :f])
        target = torch.einsum("...kno,ko->...kn", z, self.a[:, f:])
        scores = F.leaky_relu(
            source[..., :, None] + target[..., None, :], self.negative_slope
        )
        edges = adjacency | torch.eye(adjacency.size(0), dtype=torch.bool)
        weights = torch.softmax(scores.masked_fill(~edges, -1e30), -1)
        out = weights @ z  # (..., K, N, F_out)
        if self.concat:
            return out.movedim(-3, -2).flatten(-2), weights
        return out.mean(-3), weights


def _memory_softmax_then_renormalise(query, keys, values, temperature=1.0, top_k=None):
    scores = (query.double() @ keys.double().transpose(-2, -1)) / temperature
    weights = torch.softmax(scores, -1)
    if top_k is not None:
        threshold = scores.topk(min(top_k, scores.size(-1)), -1).values[..., -1:]
        weights = weights * (scores >= threshold)
        weights = weights / weights.sum(-1, keepdim=True)
    return (weights @ values.double()).float(), weights.float()


def _cross_by_heads(x_queries, x_context, W_q, W_k, W_v, W_o, num_heads, mask=None):
    d_head = W_q.size(1) // num_heads
    outs, weights = [], []
    for i in range(num_heads):
        cols = slice(i * d_head, (i + 1) * d_head)
        q, k, v = (
            x_queries @ W_q[:, cols],
            x_context @ W_k[:, cols],
            x_context @ W_v[:, cols],
        )
        scores = torch.einsum("bqd,bkd->bqk", q, k) * d_head**-0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e30)
        alpha = torch.softmax(scores, -1)
        outs.append(alpha @ v)
        weights.append(alpha)
    return torch.cat(outs, -1) @ W_o, torch.stack(weights, 1)


class _LatentByHeads(bs.LatentAttention):
    def forward(self, x, mask=None):
        latents = self.latents.unsqueeze(0).repeat(x.size(0), 1, 1)
        return _cross_by_heads(
            latents,
            x,
            self.W_q.weight.t(),
            self.W_k.weight.t(),
            self.W_v.weight.t(),
            self.W_o.weight.t(),
            self.num_heads,
            None if mask is None else mask.unsqueeze(1),
        )


def _rollout_half_identity(attentions, residual=True):
    """The paper's 0.5 W_att + 0.5 I, multiplied up from the first layer with bmm."""
    rollout = None
    for layer in attentions:
        A = layer.mean(1)
        if residual:
            A = 0.5 * A + 0.5 * torch.eye(A.size(-1))
        rollout = A if rollout is None else torch.bmm(A, rollout)
    return rollout


INDEPENDENT_CORRECT_ANSWERS = {
    "patchify": [_patchify_by_loops],
    "PatchEmbedding": [_EmbeddingByIndex],
    "VisionTransformer": [_VitFunctional],
    "graph_attention": [_gat_edges_float64],
    "GATLayer": [_GATEinsum],
    "memory_lookup": [_memory_softmax_then_renormalise],
    "cross_attention": [_cross_by_heads],
    "LatentAttention": [_LatentByHeads],
    "attention_rollout": [_rollout_half_identity],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, bs, exercise, right, seed)


def test_every_exercise_has_a_mistake_catalogue_of_at_least_three():
    from autograder.grading.judging.spec import load_chapter_tests

    tests = load_chapter_tests(CHAPTER)
    for exercise in tests.exercises:
        assert len(tests.mistakes_for(exercise)) >= 3, exercise
    names = {m.name for m in tests.mistakes}
    for required in (
        "column-major patch order",
        "class token without a position",
        "softmax over all nodes",
        "LeakyReLU slope 0.01",
        "no LeakyReLU",
        "no residual identity",
        "not renormalised",
        "softmax over the wrong axis",
    ):
        assert required in names, required
    assert math.isclose(tests.max_score, 20.0)

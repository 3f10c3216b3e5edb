"""Chapter 4: the reference against nn.MultiheadAttention and the paper's formula, and the
hidden tests against wrong and right answers written outside the mistake catalogue."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.grading.judging.spec import load_chapter_tests
from solutions import multi_head as mh
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    verdicts,
    wrong_answers,
)

CHAPTER = "04_multi_head"


def _torch_pair(d_model, num_heads, bias=True, seed=0):
    """nn.MultiheadAttention with random weights (biases too) and our layer loaded from it."""
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True)
    with torch.no_grad():
        if bias:  # PyTorch initialises the biases to zero, which would hide bias bugs
            theirs.in_proj_bias.normal_()
            theirs.out_proj.bias.normal_()
    theirs.eval()
    ours = mh.MultiHeadAttention(d_model, num_heads, bias=bias)
    ours.load_torch_weights(theirs)
    return ours, theirs


def _assert_float32_close(got, expected):
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("d_model, num_heads", [(16, 4), (12, 3), (8, 1), (8, 8)])
def test_reference_equals_torch_self_attention(d_model, num_heads, bias):
    ours, theirs = _torch_pair(d_model, num_heads, bias)
    x = torch.randn(3, 6, d_model)
    with torch.no_grad():
        out, weights = ours(x, x, x)
        expected, expected_weights = theirs(x, x, x, average_attn_weights=False)
    _assert_float32_close(out, expected)
    _assert_float32_close(weights, expected_weights)


@pytest.mark.parametrize("bias", [True, False])
def test_reference_equals_torch_cross_attention_with_key_padding(bias):
    ours, theirs = _torch_pair(16, 4, bias, seed=1)
    query, key, value = (
        torch.randn(3, 4, 16),
        torch.randn(3, 7, 16),
        torch.randn(3, 7, 16),
    )
    lengths = torch.tensor([7, 3, 1])
    mask = (torch.arange(7) < lengths[:, None]).unsqueeze(
        1
    )  # ours: (B, 1, n_k), True = real
    with torch.no_grad():
        out, weights = ours(query, key, value, mask)
        expected, expected_weights = theirs(
            query,
            key,
            value,
            key_padding_mask=~mask[:, 0],  # theirs: (B, n_k), True = padding
            average_attn_weights=False,
        )
    _assert_float32_close(out, expected)
    _assert_float32_close(weights, expected_weights)
    assert bool((weights[2, :, :, 1:] == 0).all())


def test_reference_equals_torch_with_causal_and_per_query_masks():
    ours, theirs = _torch_pair(12, 3, seed=2)
    x = torch.randn(2, 5, 12)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    per_query = torch.rand(2, 5, 5) < 0.5
    per_query[..., 0] = True  # no empty rows: PyTorch gives NaN there, we give zeros
    with torch.no_grad():
        for ours_mask, torch_mask in [
            (causal, ~causal),  # (n, n): PyTorch's attn_mask is True where NOT allowed
            (per_query, (~per_query).repeat_interleave(3, dim=0)),  # (B * h, n, n)
        ]:
            out, weights = ours(x, x, x, ours_mask)
            expected, expected_weights = theirs(
                x, x, x, attn_mask=torch_mask, average_attn_weights=False
            )
            _assert_float32_close(out, expected)
            _assert_float32_close(weights, expected_weights)
            # the average over heads is what PyTorch returns by default
            _assert_float32_close(
                weights.mean(1), theirs(x, x, x, attn_mask=torch_mask)[1]
            )


def test_reference_equals_the_papers_formula_head_by_head():
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q,
    K W_i^K, V W_i^V), each W_i a separate matrix, written with F.scaled_dot_product_attention."""
    torch.manual_seed(3)
    d_model, h = 12, 3
    d_head = d_model // h
    layer = mh.MultiHeadAttention(d_model, h)
    query, key, value = (
        torch.randn(2, 4, d_model),
        torch.randn(2, 6, d_model),
        torch.randn(2, 6, d_model),
    )
    heads = []
    for i in range(h):
        rows = slice(i * d_head, (i + 1) * d_head)
        q, k, v = (
            F.linear(x, lin.weight[rows], lin.bias[rows])
            for x, lin in ((query, layer.W_q), (key, layer.W_k), (value, layer.W_v))
        )
        heads.append(F.scaled_dot_product_attention(q, k, v))
    expected = layer.W_o(torch.cat(heads, dim=-1))
    with torch.no_grad():
        out, weights = layer(query, key, value)
    _assert_float32_close(out, expected.detach())
    assert weights.shape == (2, h, 4, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, h, 4))


def test_split_and_merge_are_inverse_and_slice_features():
    x = torch.randn(2, 5, 12)
    heads = mh.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])  # head 1 holds features 4..7
    assert torch.equal(mh.merge_heads(heads), x)
    y = torch.randn(2, 3, 5, 4)
    assert torch.equal(mh.split_heads(mh.merge_heads(y), 3), y)


def test_one_projection_split_equals_independent_projections():
    torch.manual_seed(4)
    d_model, h = 12, 4
    d_head = d_model // h
    wide = nn.Linear(d_model, d_model)
    narrow = [nn.Linear(d_model, d_head) for _ in range(h)]
    with torch.no_grad():
        for i, p in enumerate(narrow):
            p.weight.copy_(wide.weight[i * d_head : (i + 1) * d_head])
            p.bias.copy_(wide.bias[i * d_head : (i + 1) * d_head])
    x = torch.randn(2, 5, d_model)
    with torch.no_grad():
        torch.testing.assert_close(
            mh.split_heads(wide(x), h), torch.stack([p(x) for p in narrow], dim=1)
        )
        # any other fixed assignment of features to heads is a permuted projection
        perm = torch.randperm(d_model)
        permuted = nn.Linear(d_model, d_model)
        permuted.weight.copy_(wide.weight[perm])
        permuted.bias.copy_(wide.bias[perm])
        torch.testing.assert_close(
            mh.split_heads(permuted(x), h), mh.split_heads(wide(x)[..., perm], h)
        )


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 16])
def test_parameter_count_does_not_depend_on_heads(num_heads):
    layer = mh.MultiHeadAttention(64, num_heads)
    assert sum(p.numel() for p in layer.parameters()) == 4 * 64 * 64 + 4 * 64
    theirs = nn.MultiheadAttention(64, num_heads, batch_first=True)
    assert sum(p.numel() for p in theirs.parameters()) == 4 * 64 * 64 + 4 * 64
    no_bias = mh.MultiHeadAttention(64, num_heads, bias=False)
    assert sum(p.numel() for p in no_bias.parameters()) == 4 * 64 * 64


def test_indivisible_width_and_mismatched_layers_are_rejected():
    with pytest.raises(ValueError):
        mh.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError):
        mh.split_heads(torch.randn(2, 5, 10), 3)
    for option in (
        {"kdim": 4, "vdim": 4},
        {"add_bias_kv": True},
    ):
        with pytest.raises(ValueError):
            mh.MultiHeadAttention(8, 2).load_torch_weights(
                nn.MultiheadAttention(8, 2, batch_first=True, **option)
            )
    with pytest.raises(ValueError):
        mh.MultiHeadAttention(8, 2).load_torch_weights(nn.MultiheadAttention(8, 4))
    with pytest.raises(ValueError):
        mh.MultiHeadAttention(8, 2).load_torch_weights(
            nn.MultiheadAttention(8, 2, bias=False)
        )


def test_attention_equals_sdpa_and_zeroes_empty_rows():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    mask = torch.rand(2, 1, 5, 7) < 0.5
    mask[..., 0] = True
    out, weights = mh.attention(q, k, v, mask)
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )
    mask[1, 0, 2] = False
    out, weights = mh.attention(q, k, v, mask)
    assert torch.equal(out[1, :, 2], torch.zeros(3, 4))
    assert torch.equal(weights[1, :, 2], torch.zeros(3, 7))


def test_multi_head_attention_is_permutation_equivariant():
    torch.manual_seed(5)
    layer, x = mh.MultiHeadAttention(16, 4), torch.randn(2, 6, 16)
    perm = torch.randperm(6)
    with torch.no_grad():
        out, weights = layer(x, x, x)
        out_p, weights_p = layer(x[:, perm], x[:, perm], x[:, perm])
    _assert_float32_close(out_p, out[:, perm])
    _assert_float32_close(weights_p, weights[:, :, perm][:, :, :, perm])


# ------------------------------------------- wrong answers outside the mistake catalogue


def _attention_mask_after_softmax(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    if mask is not None:
        weights = weights * mask  # zeroes masked keys but forgets to renormalise
    return weights @ v, weights


def _attention_3d_only(q, k, v, mask=None):
    # k.transpose(1, 2) is k^T for (B, n, d) but not for (B, h, n, d)
    weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.size(-1)), dim=-1)
    return weights @ v, weights


def _attention_outputs_swapped(q, k, v, mask=None):
    out, weights = mh.attention(q, k, v, mask)
    return weights, out


def _split_chunks(x, num_heads):
    return x.chunk(num_heads, dim=-1)  # a tuple of heads, not one tensor


def _split_roles_swapped(x, num_heads):
    batch, n, d_model = x.shape
    return x.reshape(batch, n, -1, num_heads).transpose(1, 2)  # (B, d_head, n, h)


def _split_heads_reversed(x, num_heads):
    return mh.split_heads(x, num_heads).flip(1)


def _merge_along_tokens(x):
    return torch.cat(x.unbind(1), dim=1)  # (B, h n, d_head)


def _merge_heads_reversed(x):
    return torch.cat(x.unbind(1)[::-1], dim=-1)


class _SharedKeyValueProjection(mh.MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        h = self.num_heads
        q, k, v = (
            mh.split_heads(t, h)
            for t in (self.W_q(query), self.W_k(key), self.W_k(value))
        )
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        out, weights = mh.attention(q, k, v, mask)
        return self.W_o(mh.merge_heads(out)), weights


class _FlatWeights(mh.MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        out, weights = super().forward(query, key, value, mask)
        return out, weights.flatten(0, 1)  # (B h, n_q, n_k) as PyTorch stores it inside


class _OnlyOutput(mh.MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask)[0]


class _ForgetsInputBiases(mh.MultiHeadAttention):
    def load_torch_weights(self, mha):
        with torch.no_grad():
            for linear, w in zip(
                (self.W_q, self.W_k, self.W_v), mha.in_proj_weight.chunk(3), strict=True
            ):
                linear.weight.copy_(w)
            self.W_o.load_state_dict(mha.out_proj.state_dict())


class _TorchQKVOrderWrong(mh.MultiHeadAttention):
    def load_torch_weights(self, mha):
        super().load_torch_weights(mha)
        with torch.no_grad():  # believes PyTorch stacks (k, q, v)
            for name in ("weight", "bias"):
                q, k = getattr(self.W_q, name).clone(), getattr(self.W_k, name).clone()
                getattr(self.W_q, name).copy_(k)
                getattr(self.W_k, name).copy_(q)


ALL_MHA = [
    "mha_self_attention",
    "mha_cross_attention",
    "mha_no_bias",
    "mha_torch_weights",
]
INDEPENDENT_WRONG_ANSWERS = {
    "attention": {
        _attention_mask_after_softmax: ["mh_attention_heads"],
        _attention_3d_only: ["mh_attention_heads"],
        _attention_outputs_swapped: ["mh_attention_heads"],
    },
    "split_heads": {
        _split_chunks: ["split_heads_values"],
        _split_roles_swapped: ["split_heads_values"],
        _split_heads_reversed: ["split_heads_values"],
    },
    "merge_heads": {
        _merge_along_tokens: ["merge_heads_values"],
        _merge_heads_reversed: ["merge_heads_values"],
    },
    "MultiHeadAttention": {
        _SharedKeyValueProjection: ALL_MHA,
        _FlatWeights: ALL_MHA,
        _OnlyOutput: ALL_MHA,
        _ForgetsInputBiases: ["mha_torch_weights"],
        _TorchQKVOrderWrong: ["mha_torch_weights"],
    },
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails(CHAPTER, mh, exercise, wrong, test_ids)


# ------------------------------------------------ correct answers written in other styles


def _attention_einsum_float64(q, k, v, mask=None):
    scores = (
        torch.einsum("...id,...jd->...ij", q.double(), k.double()) / q.shape[-1] ** 0.5
    )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return torch.einsum("...ij,...jd->...id", weights, v.double()), weights


def _divisible(x, num_heads):
    """The docstring's contract, which an independent answer states first."""
    if x.size(-1) % num_heads:
        raise ValueError(f"{x.size(-1)} features do not split into {num_heads} heads")


def _split_by_stacking_chunks(x, num_heads):
    _divisible(x, num_heads)
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def _split_by_unflatten(x, num_heads):
    _divisible(x, num_heads)
    return x.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3).contiguous()


def _merge_by_cat(x):
    return torch.cat(x.unbind(1), dim=-1)


def _merge_by_permute(x):
    return x.permute(0, 2, 1, 3).flatten(2)


class _PerHeadLoop(nn.Module):
    """The paper's formula literally: h separate heads from weight slices, a Python loop."""

    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        self.h = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (
            nn.Linear(d_model, d_model, bias=bias) for _ in range(4)
        )

    def forward(self, query, key, value, mask=None):
        d_head = query.shape[-1] // self.h
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]
        outs, weights = [], []
        for i in range(self.h):
            rows = slice(i * d_head, (i + 1) * d_head)
            q, k, v = (
                F.linear(
                    x, lin.weight[rows], None if lin.bias is None else lin.bias[rows]
                )
                for x, lin in ((query, self.W_q), (key, self.W_k), (value, self.W_v))
            )
            scores = q @ k.mT / math.sqrt(d_head)  # (B, n_q, n_k)
            m = (
                None
                if mask is None
                else mask[..., 0, :, :]
                if mask.dim() == 4
                else mask
            )
            if m is not None:
                scores = scores.masked_fill(~m, -1e30)
            w = scores.softmax(-1)
            if m is not None:
                w = w * m
            outs.append(w @ v)
            weights.append(w)
        return self.W_o(torch.cat(outs, -1)), torch.stack(weights, 1)

    def load_torch_weights(self, mha):
        state = {"W_o.weight": mha.out_proj.weight}
        for name, w in zip("qkv", mha.in_proj_weight.chunk(3), strict=True):
            state[f"W_{name}.weight"] = w
        if mha.in_proj_bias is not None:
            state["W_o.bias"] = mha.out_proj.bias
            for name, b in zip("qkv", mha.in_proj_bias.chunk(3), strict=True):
                state[f"W_{name}.bias"] = b
        self.load_state_dict(state)


class _EinsumHeads(nn.Module):
    """Heads by einsum on weight views, never calling split_heads or merge_heads."""

    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        self.h = num_heads
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    def _heads(self, lin, x):
        w = lin.weight.view(self.h, -1, x.shape[-1])  # (h, d_head, d_model)
        out = torch.einsum("bnd,hed->bhne", x, w)
        if lin.bias is not None:
            out = out + lin.bias.view(self.h, 1, -1)
        return out

    def forward(self, query, key, value, mask=None):
        q, k, v = (
            self._heads(self.W_q, query),
            self._heads(self.W_k, key),
            self._heads(self.W_v, value),
        )
        scores = torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(q.shape[-1])
        if mask is not None:
            mask = mask.unsqueeze(-3) if mask.dim() == 3 else mask
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.nan_to_num(scores.softmax(-1), nan=0.0)
        out = torch.einsum("bhqk,bhke->bqhe", weights, v).flatten(2)
        return self.W_o(out), weights

    @torch.no_grad()
    def load_torch_weights(self, mha):
        for lin, w in zip(
            (self.W_q, self.W_k, self.W_v),
            mha.in_proj_weight.split(mha.embed_dim),
            strict=True,
        ):
            lin.weight.data = w.clone()
        self.W_o.weight.data = mha.out_proj.weight.clone()
        if mha.in_proj_bias is not None:
            for lin, b in zip(
                (self.W_q, self.W_k, self.W_v),
                mha.in_proj_bias.split(mha.embed_dim),
                strict=True,
            ):
                lin.bias.data = b.clone()
            self.W_o.bias.data = mha.out_proj.bias.clone()


class _NamesTheClassInAHint(_PerHeadLoop):
    """The chapter says a type hint and an isinstance check naming nn.MultiheadAttention
    are fine: such an answer must earn every point."""

    def load_torch_weights(self, mha: nn.MultiheadAttention) -> None:
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected PyTorch's multi-head layer, got {type(mha)}")
        super().load_torch_weights(mha)


INDEPENDENT_CORRECT_ANSWERS = {
    "attention": [_attention_einsum_float64],
    "split_heads": [_split_by_stacking_chunks, _split_by_unflatten],
    "merge_heads": [_merge_by_cat, _merge_by_permute],
    "MultiHeadAttention": [_PerHeadLoop, _EinsumHeads, _NamesTheClassInAHint],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, mh, exercise, right, seed)


def test_feedback_names_the_pytorch_mask_convention():
    """A student who keeps nn.MultiheadAttention's convention (True = masked) is told so."""
    tests = load_chapter_tests(CHAPTER)

    class PyTorchConvention(mh.MultiHeadAttention):
        def forward(self, query, key, value, mask=None):
            return super().forward(query, key, value, None if mask is None else ~mask)

    results = verdicts(tests, {**vars(mh), "MultiHeadAttention": PyTorchConvention}, 0)
    assert (
        "nn.MultiheadAttention's convention" in results["mha_cross_attention"].message
    )

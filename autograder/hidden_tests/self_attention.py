"""Hidden tests for chapter 3, self-attention (10 points)."""

import math

import torch

from autograder.grading.spec import HiddenTest, Init, Mistake, case
from solutions import self_attention as ref


def _randn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


def _qkv(g, batch, n_q, n_k, d_k, d_v, scale=1.0):
    return (
        _randn(g, *batch, n_q, d_k, scale=scale),
        _randn(g, *batch, n_k, d_k, scale=scale),
        _randn(g, *batch, n_k, d_v),
    )


def _random_mask(g, *shape):
    """A bool mask with at least one True per query row."""
    mask = torch.rand(*shape, generator=g) < 0.6
    mask[..., torch.randint(shape[-1], (), generator=g)] = True
    return mask


def _sdpa_basic_cases(g):
    return [
        case(*_qkv(g, (2,), 5, 7, 8, 3), label="n_q != n_k and d_k != d_v"),
        case(
            *_qkv(g, (2, 3), 4, 4, 16, 16), label="extra batch dimensions (B, h, n, d)"
        ),
        case(*_qkv(g, (), 6, 6, 32, 32), label="no batch dimension"),
    ]


def _sdpa_masked_cases(g):
    lengths = torch.tensor([7, 3])
    return [
        case(
            *_qkv(g, (2,), 6, 6, 8, 8),
            mask=ref.causal_mask(6),
            label="causal mask of shape (n, n)",
        ),
        case(
            *_qkv(g, (2,), 5, 7, 8, 4),
            mask=ref.padding_mask(lengths, 7),
            label="padding mask of shape (B, 1, n_k)",
        ),
        case(
            *_qkv(g, (2, 3), 5, 7, 8, 8),
            mask=_random_mask(g, 2, 1, 5, 7),
            label="mask broadcast over heads",
        ),
    ]


def _sdpa_edge_cases(g):
    fully_masked = _random_mask(g, 2, 6, 6)
    fully_masked[0, 1] = False
    fully_masked[1, 4] = False
    return [
        case(
            *_qkv(g, (2,), 6, 6, 8, 8),
            mask=fully_masked,
            label="fully masked query rows must give zeros",
        ),
        case(*_qkv(g, (3,), 1, 1, 4, 4), label="sequences of length 1"),
        case(*_qkv(g, (2,), 5, 5, 16, 16, scale=30.0), label="very large logits"),
        case(
            *_qkv(g, (2,), 5, 5, 16, 16, scale=30.0),
            mask=_random_mask(g, 2, 5, 5),
            label="very large logits with a mask",
        ),
    ]


def _causal_mask_cases(g):
    return [case(n, label=f"n = {n}") for n in (1, 3, 8)]


def _padding_mask_cases(g):
    return [
        case(torch.tensor([3, 0, 5]), 5, label="lengths 3, 0 and 5 with n = 5"),
        case(torch.tensor([1]), 1, label="one sequence of length 1"),
        case(torch.randint(1, 9, (4,), generator=g), 9, label="random lengths"),
    ]


def _self_attention_cases(g):
    init = Init((12, 8, 5))
    x = _randn(g, 2, 6, 12)
    return [
        case(x, init=init, label="no mask"),
        case(x, mask=ref.causal_mask(6), init=init, label="causal mask"),
        case(
            _randn(g, 3, 4, 12),
            mask=ref.padding_mask(torch.tensor([4, 2, 1]), 4),
            init=init,
            label="padding mask",
        ),
    ]


TESTS = [
    HiddenTest(
        id="sdpa_basic",
        exercise="scaled_dot_product_attention",
        forbidden=("sdpa",),
        points=2,
        description="output and weights equal softmax(q k^T / sqrt(d_k)) v for any batch dimensions",
        make_cases=_sdpa_basic_cases,
        outputs=("out", "weights"),
    ),
    HiddenTest(
        id="sdpa_masked",
        exercise="scaled_dot_product_attention",
        forbidden=("sdpa",),
        points=2,
        description="boolean masks (True = may attend) broadcast and give masked keys zero weight",
        make_cases=_sdpa_masked_cases,
        outputs=("out", "weights"),
    ),
    HiddenTest(
        id="sdpa_edge_cases",
        exercise="scaled_dot_product_attention",
        forbidden=("sdpa",),
        points=2,
        description="fully masked rows give zeros (not NaN), length 1 works, huge logits stay finite",
        make_cases=_sdpa_edge_cases,
        outputs=("out", "weights"),
    ),
    HiddenTest(
        id="causal_mask_values",
        exercise="causal_mask",
        points=1,
        description="an (n, n) bool mask that lets query i see keys j <= i",
        make_cases=_causal_mask_cases,
        level="exact",
    ),
    HiddenTest(
        id="padding_mask_values",
        exercise="padding_mask",
        points=1,
        description="a (B, 1, n) bool mask that is True on the first lengths[b] keys",
        make_cases=_padding_mask_cases,
        level="exact",
    ),
    HiddenTest(
        id="self_attention_module",
        exercise="SelfAttention",
        forbidden=("sdpa",),
        points=2,
        description="SelfAttention projects x with W_q, W_k, W_v and attends, with and without masks",
        make_cases=_self_attention_cases,
        level="module",
        outputs=("out", "weights"),
    ),
]


# ---------------------------------------------------------------- plausible wrong answers


def _wrong_sdpa(
    *, scale="sqrt", softmax_dim=-1, invert_mask=False, transpose=False, fill=None
):
    """scaled_dot_product_attention with one deliberate slip. ``fill``: the value put in
    masked scores by a version that does not zero fully masked rows afterwards."""

    def sdpa(q, k, v, mask=None):
        d_k = q.size(-1)
        scores = q @ k.transpose(-2, -1)
        if transpose:
            scores = scores.transpose(-2, -1)
        scores = scores / {"sqrt": math.sqrt(d_k), "none": 1.0, "d_k": d_k}[scale]
        if mask is not None:
            mask = ~mask if invert_mask else mask
            value = torch.finfo(scores.dtype).min if fill is None else fill
            scores = scores.masked_fill(~mask, value)
        weights = torch.softmax(scores, dim=softmax_dim)
        if mask is not None and fill is None:
            weights = weights.masked_fill(~mask, 0.0)
        return weights @ v, weights

    return sdpa


def _causal_upper(n, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).triu()


def _causal_strict(n, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)


def _causal_float(n, device=None):
    return torch.ones(n, n, device=device).tril()


def _padding_no_middle_dim(lengths, n):
    return torch.arange(n) < lengths[:, None]


def _padding_off_by_one(lengths, n):
    return (torch.arange(n) <= lengths[:, None]).unsqueeze(1)


def _padding_inverted(lengths, n):
    return (torch.arange(n) >= lengths[:, None]).unsqueeze(1)


class _SelfAttentionUnscaled(ref.SelfAttention):
    def forward(self, x, mask=None):
        return _wrong_sdpa(scale="none")(self.W_q(x), self.W_k(x), self.W_v(x), mask)


class _SelfAttentionSwappedQK(ref.SelfAttention):
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(
            self.W_k(x), self.W_q(x), self.W_v(x), mask
        )


class _SelfAttentionIgnoresMask(ref.SelfAttention):
    def forward(self, x, mask=None):
        return ref.scaled_dot_product_attention(self.W_q(x), self.W_k(x), self.W_v(x))


SDPA = "scaled_dot_product_attention"
MISTAKES = [
    Mistake(
        SDPA,
        "unscaled",
        "your scores look unscaled: did you divide q k^T by sqrt(d_k)?",
        _wrong_sdpa(scale="none"),
    ),
    Mistake(
        SDPA,
        "scaled by d_k",
        "your scores look divided by d_k: the scale is 1/sqrt(d_k), not 1/d_k.",
        _wrong_sdpa(scale="d_k"),
    ),
    Mistake(
        SDPA,
        "softmax over queries",
        "your weights look normalised over the queries: take the softmax over the last dimension (the keys), so each query's row sums to 1.",
        _wrong_sdpa(softmax_dim=-2),
    ),
    Mistake(
        SDPA,
        "transposed scores",
        "your scores look transposed (k q^T instead of q k^T): row i must hold query i's scores against every key.",
        _wrong_sdpa(transpose=True),
    ),
    Mistake(
        SDPA,
        "inverted mask",
        "your mask looks inverted: True means the query MAY attend to that key; hide the positions where the mask is False.",
        _wrong_sdpa(invert_mask=True),
    ),
    Mistake(
        SDPA,
        "-inf fill",
        "fully masked rows come out as NaN: filling with -inf makes the softmax divide 0 by "
        "0; zero the weights of rows that may attend to nothing.",
        _wrong_sdpa(fill=float("-inf")),
    ),
    Mistake(
        SDPA,
        "-1e9 fill",
        "fully masked rows get uniform weights instead of zeros: with a finite fill (like "
        "-1e9) their softmax is uniform; zero the weights of masked positions afterwards.",
        _wrong_sdpa(fill=-1e9),
    ),
    Mistake(
        "causal_mask",
        "upper triangle",
        "your mask lets queries see the future: query i may attend to keys j <= i (the lower triangle, diagonal included).",
        _causal_upper,
    ),
    Mistake(
        "causal_mask",
        "diagonal excluded",
        "your mask hides the diagonal: a token may attend to itself (j <= i, not j < i).",
        _causal_strict,
    ),
    Mistake(
        "causal_mask",
        "not bool",
        "your mask is not a bool tensor: return dtype torch.bool (True = may attend).",
        _causal_float,
    ),
    Mistake(
        "padding_mask",
        "no query dimension",
        "your mask has shape (B, n): add the query dimension so it is (B, 1, n) and broadcasts over queries.",
        _padding_no_middle_dim,
    ),
    Mistake(
        "padding_mask",
        "off by one",
        "your mask includes one key too many: key j is real when j < lengths[b], not j <= lengths[b].",
        _padding_off_by_one,
    ),
    Mistake(
        "padding_mask",
        "inverted",
        "your mask looks inverted: True marks real tokens (may attend), False marks padding.",
        _padding_inverted,
    ),
    Mistake(
        "SelfAttention",
        "unscaled",
        "your attention scores look unscaled: divide q k^T by sqrt(d_k).",
        _SelfAttentionUnscaled,
    ),
    Mistake(
        "SelfAttention",
        "queries and keys swapped",
        "queries and keys look swapped: q comes from W_q and k from W_k.",
        _SelfAttentionSwappedQK,
    ),
    Mistake(
        "SelfAttention",
        "mask ignored",
        "your module ignores the mask: pass it on to scaled_dot_product_attention.",
        _SelfAttentionIgnoresMask,
    ),
]

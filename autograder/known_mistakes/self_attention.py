"""Known mistakes of self attention: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import torch

from autograder.grading.judging.spec import Mistake
from autograder.known_mistakes._attention import wrong_attention
from solutions import self_attention as ref


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
        return wrong_attention(scale="none")(
            self.W_q(x), self.W_k(x), self.W_v(x), mask
        )


class _SelfAttentionSwappedQK(ref.SelfAttention):
    def forward(self, x, mask=None):
        return wrong_attention()(self.W_k(x), self.W_q(x), self.W_v(x), mask)


class _SelfAttentionIgnoresMask(ref.SelfAttention):
    def forward(self, x, mask=None):
        return wrong_attention()(self.W_q(x), self.W_k(x), self.W_v(x))


SDPA = "scaled_dot_product_attention"
MISTAKES = [
    Mistake(
        SDPA,
        "unscaled",
        "your scores look unscaled: did you divide q k^T by sqrt(d_k)?",
        wrong_attention(scale="none"),
        section="03_self_attention#scaled-dot-product-attention",
    ),
    Mistake(
        SDPA,
        "scaled by d_k",
        "your scores look divided by d_k: the scale is 1/sqrt(d_k), not 1/d_k.",
        wrong_attention(scale="d_k"),
        section="03_self_attention#scaled-dot-product-attention",
    ),
    Mistake(
        SDPA,
        "softmax over queries",
        "your weights look normalised over the queries: take the softmax over the last dimension (the keys), so each query's row sums to 1.",
        wrong_attention(softmax_dim=-2),
        section="03_self_attention#scaled-dot-product-attention",
    ),
    Mistake(
        SDPA,
        "transposed scores",
        "your scores look transposed (k q^T instead of q k^T): row i must hold query i's scores against every key.",
        wrong_attention(transpose=True),
        section="03_self_attention#scaled-dot-product-attention",
    ),
    Mistake(
        SDPA,
        "inverted mask",
        "your mask looks inverted: True means the query MAY attend to that key; hide the positions where the mask is False.",
        wrong_attention(invert_mask=True),
        section="03_self_attention#exercise-1-scaled-dot-product-attention-with-masks",
    ),
    Mistake(
        SDPA,
        "-inf fill",
        "fully masked rows come out as NaN: filling with -inf makes the softmax divide 0 by "
        "0; zero the weights of rows that may attend to nothing.",
        wrong_attention(fill=float("-inf")),
        section="03_self_attention#exercise-1-scaled-dot-product-attention-with-masks",
    ),
    Mistake(
        SDPA,
        "-1e9 fill",
        "fully masked rows get uniform weights instead of zeros: with a finite fill (like "
        "-1e9) their softmax is uniform; zero the weights of masked positions afterwards.",
        wrong_attention(fill=-1e9),
        section="03_self_attention#exercise-1-scaled-dot-product-attention-with-masks",
    ),
    Mistake(
        "causal_mask",
        "upper triangle",
        "your mask lets queries see the future: query i may attend to keys j <= i (the lower triangle, diagonal included).",
        _causal_upper,
        section="03_self_attention#exercise-2-causal-and-padding-masks",
    ),
    Mistake(
        "causal_mask",
        "diagonal excluded",
        "your mask hides the diagonal: a token may attend to itself (j <= i, not j < i).",
        _causal_strict,
        section="03_self_attention#exercise-2-causal-and-padding-masks",
    ),
    Mistake(
        "causal_mask",
        "not bool",
        "your mask is not a bool tensor: return dtype torch.bool (True = may attend).",
        _causal_float,
        section="03_self_attention#exercise-2-causal-and-padding-masks",
    ),
    Mistake(
        "padding_mask",
        "no query dimension",
        "your mask has shape (B, n): add the query dimension so it is (B, 1, n) and broadcasts over queries.",
        _padding_no_middle_dim,
        section="03_self_attention#exercise-2-causal-and-padding-masks",
    ),
    Mistake(
        "padding_mask",
        "off by one",
        "your mask includes one key too many: key j is real when j < lengths[b], not j <= lengths[b].",
        _padding_off_by_one,
        section="03_self_attention#exercise-2-causal-and-padding-masks",
    ),
    Mistake(
        "padding_mask",
        "inverted",
        "your mask looks inverted: True marks real tokens (may attend), False marks padding.",
        _padding_inverted,
        section="03_self_attention#exercise-2-causal-and-padding-masks",
    ),
    Mistake(
        "SelfAttention",
        "unscaled",
        "your attention scores look unscaled: divide q k^T by sqrt(d_k).",
        _SelfAttentionUnscaled,
        section="03_self_attention#scaled-dot-product-attention",
    ),
    Mistake(
        "SelfAttention",
        "queries and keys swapped",
        "queries and keys look swapped: q comes from W_q and k from W_k.",
        _SelfAttentionSwappedQK,
        section="03_self_attention#exercise-3-a-self-attention-layer",
    ),
    Mistake(
        "SelfAttention",
        "mask ignored",
        "your module ignores the mask: pass it on to scaled_dot_product_attention.",
        _SelfAttentionIgnoresMask,
        section="03_self_attention#exercise-3-a-self-attention-layer",
    ),
]

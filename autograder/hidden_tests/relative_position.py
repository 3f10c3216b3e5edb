"""Hidden tests for chapter 7, relative position representations (15 points)."""

import torch

from autograder.grading.judging.spec import HiddenTest, Init, case
from autograder.hidden_tests._inputs import randn


def _index_cases(g):
    return [
        case(5, 2, label="n = 5, k = 2 (the chapter's worked example)"),
        case(12, 3, label="n = 12, k = 3: clipped on both sides"),
        case(4, 6, label="n = 4 < k = 6: nothing clipped"),
        case(1, 3, label="n = 1"),
        case(9, 1, label="k = 1"),
    ]


def _embedding_cases(g):
    return [
        case(6, init=Init((2, 3)), label="k = 2, d = 3, n = 6"),
        case(13, init=Init((3, 8)), label="k = 3, d = 8, n = 13 > 2k + 1"),
        case(3, init=Init((5, 4)), label="n = 3 < k = 5"),
        case(1, init=Init((1, 5)), label="n = 1"),
    ]


def _logits_inputs(g, batch, heads, n, d, zero=False):
    a_k = torch.zeros(n, n, d) if zero else randn(g, n, n, d)
    return randn(g, batch, heads, n, d), randn(g, batch, heads, n, d), a_k


def _logits_cases(g):
    return [
        case(*_logits_inputs(g, 2, 3, 5, 8), label="B = 2, h = 3, n = 5, d = 8"),
        case(*_logits_inputs(g, 3, 2, 11, 16), label="B = 3, h = 2, n = 11, d = 16"),
        case(*_logits_inputs(g, 1, 4, 7, 4), label="one sequence, four heads"),
        case(*_logits_inputs(g, 2, 1, 1, 4), label="n = 1"),
        case(
            *_logits_inputs(g, 2, 2, 6, 8, zero=True),
            label="a_k = 0 gives ordinary scaled dot products",
        ),
    ]


def _output_inputs(g, batch, heads, n, d):
    weights = torch.softmax(randn(g, batch, heads, n, n, scale=2.0), dim=-1)
    return weights, randn(g, batch, heads, n, d), randn(g, n, n, d)


def _output_cases(g):
    return [
        case(*_output_inputs(g, 2, 3, 5, 8), label="B = 2, h = 3, n = 5, d = 8"),
        case(*_output_inputs(g, 3, 2, 10, 4), label="B = 3, h = 2, n = 10, d = 4"),
        case(*_output_inputs(g, 1, 4, 6, 16), label="one sequence, four heads"),
        case(*_output_inputs(g, 2, 1, 1, 4), label="n = 1"),
    ]


def _module_cases(g):
    return [
        case(
            randn(g, 2, 9, 16),
            init=Init((16, 4, 3)),
            label="d_model 16, 4 heads, k = 3, n = 9",
        ),
        case(randn(g, 3, 4, 12), init=Init((12, 3, 6)), label="n = 4 < k = 6"),
        case(randn(g, 1, 12, 8), init=Init((8, 1, 2)), label="one head, n = 12"),
        case(randn(g, 2, 1, 8), init=Init((8, 2, 2)), label="n = 1"),
    ]


def _module_masked_cases(g):
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    padding = (torch.tensor([7, 3])[:, None] > torch.arange(7)).unsqueeze(
        1
    )  # (B, 1, n)
    fully_masked = torch.rand(2, 6, 6, generator=g) < 0.6
    fully_masked[..., 0] = True
    fully_masked[1, 2] = False  # query 2 of sequence 1 may attend to nothing
    return [
        case(
            randn(g, 2, 8, 16),
            mask=causal,
            init=Init((16, 4, 3)),
            label="causal mask (n, n)",
        ),
        case(
            randn(g, 2, 7, 12),
            mask=padding,
            init=Init((12, 2, 2)),
            label="padding mask (B, 1, n)",
        ),
        case(
            randn(g, 2, 6, 8),
            mask=fully_masked,
            init=Init((8, 2, 4)),
            label="mask (B, n, n) with a fully masked query row",
        ),
    ]


def _alibi_cases(g):
    return [
        case(6, 8, label="n = 6, 8 heads"),
        case(5, 4, label="n = 5, 4 heads"),
        case(9, 16, label="n = 9, 16 heads"),
        case(1, 2, label="n = 1, 2 heads"),
    ]


TESTS = [
    HiddenTest(
        id="rp_index_values",
        exercise="relative_position_index",
        points=2,
        description="an (n, n) long tensor with index[i, j] = clip(j - i, -k, k) + k",
        make_cases=_index_cases,
        level="exact",
    ),
    HiddenTest(
        id="rp_embedding_lookup",
        exercise="RelativePositionEmbedding",
        points=2,
        description="the (n, n, d) lookup returns table row clip(j - i, k) + k at [i, j]",
        make_cases=_embedding_cases,
    ),
    HiddenTest(
        id="rp_logits",
        exercise="relative_attention_logits",
        points=3,
        description="e_ij = q_i . (k_j + a_ij) / sqrt(d) for several batch, head and length sizes",
        make_cases=_logits_cases,
    ),
    HiddenTest(
        id="rp_output",
        exercise="relative_attention_output",
        points=2,
        description="z_i = sum_j w_ij (v_j + a_ij) for several batch, head and length sizes",
        make_cases=_output_cases,
    ),
    HiddenTest(
        id="rp_module",
        exercise="RelativeMultiHeadAttention",
        points=2,
        description="outputs and per-head weights of relation-aware multi-head self-attention",
        make_cases=_module_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=("sdpa", "mha"),
    ),
    HiddenTest(
        id="rp_module_masked",
        exercise="RelativeMultiHeadAttention",
        points=2,
        description="causal, padding and fully masked rows (True = may attend), shared by all heads",
        make_cases=_module_masked_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=("sdpa", "mha"),
    ),
    HiddenTest(
        id="alibi_bias_values",
        exercise="alibi_bias",
        points=2,
        description="bias[h - 1, i, j] = -m_h |i - j| with slopes m_h = 2^(-8h/H)",
        make_cases=_alibi_cases,
    ),
]

"""Hidden tests for chapter 3, self-attention (10 points)."""

import torch

from autograder.grading.judging.spec import HiddenTest, Init, case
from autograder.hidden_tests._inputs import randn, random_mask
from solutions import self_attention as ref


def _qkv(g, batch, n_q, n_k, d_k, d_v, scale=1.0):
    return (
        randn(g, *batch, n_q, d_k, scale=scale),
        randn(g, *batch, n_k, d_k, scale=scale),
        randn(g, *batch, n_k, d_v),
    )


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
            mask=random_mask(g, 2, 1, 5, 7),
            label="mask broadcast over heads",
        ),
    ]


def _sdpa_edge_cases(g):
    fully_masked = random_mask(g, 2, 6, 6)
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
            mask=random_mask(g, 2, 5, 5),
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
    x = randn(g, 2, 6, 12)
    return [
        case(x, init=init, label="no mask"),
        case(x, mask=ref.causal_mask(6), init=init, label="causal mask"),
        case(
            randn(g, 3, 4, 12),
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

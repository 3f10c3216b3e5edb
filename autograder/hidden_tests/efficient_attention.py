"""Hidden tests for chapter 8, efficient attention (26 points).

The exact methods are compared with the reference, which equals PyTorch's
``F.scaled_dot_product_attention`` (tests/test_efficient_attention.py checks that); they may
not delegate to it. Memory is not graded here: outputs cannot show how they were computed.
The visible checks measure it, and the project's tests hold the references to it.
"""

import torch

from autograder.grading.judging.spec import HiddenTest, case
from autograder.hidden_tests._inputs import randn


def _qkv(g, batch, n_q, n_k, d, d_v, scale=1.0):
    return (
        randn(g, *batch, n_q, d, scale=scale),
        randn(g, *batch, n_k, d, scale=scale),
        randn(g, *batch, n_k, d_v),
    )


# ------------------------------------------------------------------------------- cases


def _chunked_cases(g):
    return [
        case(
            *_qkv(g, (2, 3), 10, 10, 8, 8), 4, label="chunk size 4 does not divide 10"
        ),
        case(*_qkv(g, (2,), 7, 12, 8, 5), 3, label="n_q != n_k and d != d_v"),
        case(*_qkv(g, (), 6, 6, 16, 16), 1, label="chunks of one query"),
        case(*_qkv(g, (3,), 5, 9, 4, 4), 64, label="one chunk larger than n"),
        case(*_qkv(g, (2,), 9, 9, 16, 16, scale=4.0), 4, label="large logits"),
    ]


def _flash_cases(g):
    return [
        case(
            *_qkv(g, (2, 2), 10, 10, 8, 8),
            block_size=4,
            label="blocks of 4 keys, n = 10",
        ),
        case(*_qkv(g, (2,), 9, 13, 8, 6), block_size=5, label="n_q != n_k, d != d_v"),
        case(*_qkv(g, (), 12, 12, 16, 16), block_size=1, label="blocks of one key"),
        case(*_qkv(g, (3,), 20, 20, 8, 8), label="default block_size: one block"),
        case(
            *_qkv(g, (2,), 12, 12, 16, 16, scale=10.0),
            block_size=3,
            label="very large logits",
        ),
    ]


def _flash_causal_cases(g):
    return [
        case(
            *_qkv(g, (2, 2), 12, 12, 8, 8),
            block_size=4,
            causal=True,
            label="causal, blocks of 4, n = 12",
        ),
        case(
            *_qkv(g, (2,), 11, 11, 8, 5),
            block_size=4,
            causal=True,
            label="causal, blocks of 4, n = 11",
        ),
        case(
            *_qkv(g, (), 7, 7, 4, 4),
            block_size=1,
            causal=True,
            label="causal, blocks of one key",
        ),
        case(
            *_qkv(g, (2,), 6, 10, 8, 8),
            block_size=4,
            causal=True,
            label="causal with n_q < n_k",
        ),
        case(
            *_qkv(g, (2,), 12, 12, 16, 16, scale=10.0),
            block_size=5,
            causal=True,
            label="causal with very large logits",
        ),
    ]


# what FlashAttentionFunction's forward saves with ctx.save_for_backward, as the
# docstring says: a backward that autograd runs through the tiles saves none of it
SAVED = "saved tensors (q, k, v, out, L)"


def _grad_case(g, batch, n_q, n_k, d, d_v, *extra, scale=1.0, label, **kwargs):
    """q, k, v (then ``extra`` positional arguments) and a drawn upstream gradient
    dL/d(out): the call returns (out, dq, dk, dv)."""
    q, k, v = _qkv(g, batch, n_q, n_k, d, d_v, scale=scale)
    upstream = randn(g, *batch, n_q, d_v)
    return case(q, k, v, *extra, upstream_grad=upstream, label=label, **kwargs)


def _function_grad_cases(g, causal):
    """FlashAttentionFunction.apply(q, k, v, causal, block_size)."""
    shapes = [  # batch, n_q, n_k, d, d_v, block_size, label
        ((2, 2), 12, 12, 8, 8, 4, "n = 12, blocks of 4"),
        ((2,), 6, 13, 8, 8, 4, "n_q = 6 < n_k = 13"),
        ((2,), 13, 6, 8, 5, 3, "n_q = 13 > n_k = 6, d != d_v"),
        ((), 5, 5, 4, 4, 1, "blocks of one"),
        ((2,), 20, 20, 8, 8, 64, "one tile larger than n"),
    ]
    cases = [
        _grad_case(
            g,
            batch,
            n_q,
            n_k,
            d,
            d_v,
            causal,
            b,
            method="apply",
            saved=True,
            label=label,
        )
        for batch, n_q, n_k, d, d_v, b, label in shapes
    ]
    cases.append(
        _grad_case(
            g,
            (2,),
            12,
            12,
            16,
            16,
            causal,
            5,
            scale=3.0,
            method="apply",
            saved=True,
            label="large logits",
        )
    )
    return cases


def _autograd_cases(g):
    """flash_attention_autograd(q, k, v, causal=False, block_size=64), by keyword."""
    return [
        _grad_case(g, (2,), 9, 13, 8, 6, block_size=5, label="n_q != n_k, blocks of 5"),
        _grad_case(
            g,
            (2,),
            6,
            13,
            8,
            8,
            causal=True,
            block_size=4,
            label="causal, n_q = 6 < n_k = 13, blocks of 4",
        ),
        _grad_case(g, (2,), 70, 70, 8, 8, label="default block_size 64, n = 70"),
        _grad_case(
            g,
            (2,),
            70,
            70,
            8,
            8,
            causal=True,
            label="causal, default block_size, n = 70",
        ),
    ]


def _bias_cases(g):
    """Inputs (..., h, n, d) and a table of h rows of 2K + 1 offset biases."""

    def inputs(batch, h, n_q, n_k, d, d_v, K, bias_scale=1.0):
        return (
            *_qkv(g, (*batch, h), n_q, n_k, d, d_v),
            randn(g, h, 2 * K + 1, scale=bias_scale),
        )

    return [
        case(
            *inputs((2,), 2, 10, 10, 8, 8, 3), block_size=4, label="blocks of 4, K = 3"
        ),
        case(
            *inputs((), 3, 7, 12, 8, 5, 2),
            block_size=5,
            label="n_q != n_k and d != d_v",
        ),
        case(*inputs((2,), 2, 9, 9, 4, 4, 1), block_size=1, label="blocks of one key"),
        case(
            *inputs((1,), 4, 20, 20, 8, 8, 25),
            label="default block_size, K larger than n (no offset clipped)",
        ),
        case(
            *inputs((2,), 2, 12, 12, 8, 8, 4, bias_scale=100.0),
            block_size=3,
            label="large biases, positive and negative",
        ),
    ]


def _window_mask_cases(g):
    return [
        case(n, w, label=f"n = {n}, window = {w}")
        for n, w in ((6, 1), (7, 2), (9, 3), (5, 0), (4, 10), (1, 0))
    ]


def _local_cases(g):
    return [
        case(*_qkv(g, (2, 2), 12, 12, 8, 8), 2, label="window 2"),
        case(*_qkv(g, (2,), 9, 9, 8, 5), 3, label="window 3, d != d_v"),
        case(*_qkv(g, (), 6, 6, 4, 4), 0, label="window 0"),
        case(*_qkv(g, (3,), 7, 7, 8, 8), 20, label="window wider than the sequence"),
        case(*_qkv(g, (2,), 10, 10, 16, 16, scale=4.0), 1, label="large logits"),
    ]


def _linear_cases(g):
    return [
        case(*_qkv(g, (2, 3), 10, 10, 8, 8), label="self-attention shapes"),
        case(*_qkv(g, (2,), 7, 12, 8, 5), label="n_q != n_k and d != d_v"),
        case(*_qkv(g, (), 6, 6, 16, 16, scale=3.0), label="large inputs"),
    ]


def _linear_causal_cases(g):
    return [
        case(*_qkv(g, (2, 2), 10, 10, 8, 8), causal=True, label="causal"),
        case(*_qkv(g, (3,), 6, 6, 16, 3), causal=True, label="causal, d != d_v"),
        case(*_qkv(g, (2,), 1, 1, 4, 4), causal=True, label="causal, length 1"),
    ]


def _performer_features_cases(g):
    return [
        case(randn(g, 2, 10, 8, scale=0.5), randn(g, 16, 8), label="m = 16, d = 8"),
        case(randn(g, 3, 5, 4, scale=0.5), randn(g, 7, 4), label="m = 7 != d = 4"),
        case(randn(g, 6, 4), randn(g, 32, 4), label="no batch dimension"),
    ]


def _performer_cases(g):
    return [
        case(
            *_qkv(g, (2, 2), 10, 10, 8, 8, scale=0.7),
            32,
            projection=randn(g, 32, 8),
            label="m = 32 features",
        ),
        case(
            *_qkv(g, (2,), 6, 9, 8, 5, scale=0.7),
            64,
            projection=randn(g, 64, 8),
            label="n_q != n_k and d != d_v",
        ),
        case(
            *_qkv(g, (), 12, 12, 4, 4),
            5,
            projection=randn(g, 5, 4),
            label="fewer features than dimensions",
        ),
    ]


def _linformer_cases(g):
    return [
        case(
            *_qkv(g, (2, 2), 16, 16, 8, 8),
            randn(g, 4, 16, scale=0.3),
            randn(g, 4, 16, scale=0.3),
            label="n = 16 projected to k = 4",
        ),
        case(
            *_qkv(g, (2,), 10, 12, 8, 5),
            proj_k=randn(g, 5, 12, scale=0.3),
            proj_v=randn(g, 5, 12, scale=0.3),
            label="n_q != n_k and d != d_v, projections passed by name",
        ),
        case(
            *_qkv(g, (3,), 6, 6, 16, 16),
            torch.eye(6),
            torch.eye(6),
            label="identity projections",
        ),
    ]


def _gqa_qkv(g, batch, h, groups, n_q, n_k, d, d_v):
    return (
        randn(g, batch, h, n_q, d),
        randn(g, batch, groups, n_k, d),
        randn(g, batch, groups, n_k, d_v),
    )


def _gqa_cases(g):
    return [
        case(*_gqa_qkv(g, 2, 8, 2, 6, 6, 8, 8), label="h = 8, g = 2"),
        case(*_gqa_qkv(g, 1, 6, 3, 5, 5, 16, 4), label="h = 6, g = 3, d != d_v"),
        case(*_gqa_qkv(g, 2, 4, 4, 5, 5, 8, 8), label="g = h (multi-head)"),
        case(*_gqa_qkv(g, 2, 6, 1, 4, 4, 8, 8), label="g = 1 (multi-query)"),
        case(*_gqa_qkv(g, 1, 4, 2, 3, 9, 8, 8), label="n_q != n_k"),
    ]


def _gqa_masked_cases(g):
    padding = torch.tensor([7, 4])[:, None] > torch.arange(7)  # (2, 7)
    fully_masked = torch.ones(2, 4, 5, 5, dtype=torch.bool).tril()
    fully_masked[0, 1, 3] = False
    return [
        case(
            *_gqa_qkv(g, 2, 8, 2, 6, 6, 8, 8),
            mask=torch.ones(6, 6, dtype=torch.bool).tril(),
            label="causal mask (n, n)",
        ),
        case(
            *_gqa_qkv(g, 2, 4, 2, 7, 7, 8, 5),
            mask=padding[:, None, None, :],
            label="padding mask (B, 1, 1, n)",
        ),
        case(
            *_gqa_qkv(g, 2, 4, 2, 5, 5, 8, 8),
            mask=fully_masked,
            label="a fully masked query row gives zeros",
        ),
    ]


def _kv_cases(g):
    def step(batch, h, groups, s, t, d, d_v):
        q_t, k_t, v_t = _gqa_qkv(g, batch, h, groups, s, s, d, d_v)
        cache = None
        if t:
            cache = (randn(g, batch, groups, t, d), randn(g, batch, groups, t, d_v))
        return q_t, k_t, v_t, cache

    return [
        case(*step(2, 4, 2, 1, 0, 8, 8), label="first token, no cache yet"),
        case(*step(2, 4, 2, 1, 5, 8, 6), label="one new token, 5 cached"),
        case(*step(1, 8, 2, 4, 0, 8, 8), label="prefill of 4 tokens, no cache"),
        case(*step(2, 4, 1, 3, 4, 8, 8), label="3 new tokens, 4 cached, g = 1"),
        case(*step(1, 4, 4, 1, 6, 16, 16), label="g = h, one new token"),
    ]


TESTS = [
    HiddenTest(
        id="ea_chunked",
        exercise="chunked_attention",
        points=2,
        description="chunked_attention equals softmax attention for any chunk size",
        make_cases=_chunked_cases,
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="ea_flash",
        exercise="flash_attention",
        points=2,
        description="flash_attention equals softmax attention for any block size, large logits included",
        make_cases=_flash_cases,
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="ea_flash_causal",
        exercise="flash_attention",
        points=2,
        description="flash_attention with causal=True equals causal softmax attention",
        make_cases=_flash_causal_cases,
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="ea_flash_bias",
        exercise="flash_attention_with_bias",
        points=2,
        description="flash_attention_with_bias equals softmax attention plus the "
        "materialised relative-position bias, for any block size",
        make_cases=_bias_cases,
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="ea_flash_grad",
        exercise="FlashAttentionFunction",
        points=2,
        description="FlashAttentionFunction.apply: the output and the gradients dq, dk, dv "
        "for a given upstream gradient equal softmax attention's, for any block size, "
        "and the forward saves exactly q, k, v, out and L for its own backward",
        make_cases=lambda g: _function_grad_cases(g, causal=False),
        level="module",
        outputs=("out", "dq", "dk", "dv", SAVED),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="ea_flash_grad_causal",
        exercise="FlashAttentionFunction",
        points=2,
        description="FlashAttentionFunction.apply with causal=True: the output and the "
        "gradients equal causal softmax attention's, ragged lengths included, and the "
        "forward saves exactly q, k, v, out and L",
        make_cases=lambda g: _function_grad_cases(g, causal=True),
        level="module",
        outputs=("out", "dq", "dk", "dv", SAVED),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="ea_flash_autograd",
        exercise="flash_attention_autograd",
        points=1,
        description="flash_attention_autograd(q, k, v, causal, block_size) calls "
        "FlashAttentionFunction: its output and gradients, with the default block size too",
        make_cases=_autograd_cases,
        level="module",
        outputs=("out", "dq", "dk", "dv"),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="ea_window_mask",
        exercise="sliding_window_mask",
        points=1,
        description="an (n, n) bool mask, True exactly when |i - j| <= window",
        make_cases=_window_mask_cases,
        level="exact",
    ),
    HiddenTest(
        id="ea_local",
        exercise="local_attention",
        points=1,
        description="local_attention equals softmax attention with the sliding-window mask",
        make_cases=_local_cases,
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="ea_linear",
        exercise="linear_attention",
        points=1,
        description="linear_attention with phi(x) = elu(x) + 1, normalised, without a mask",
        make_cases=_linear_cases,
    ),
    HiddenTest(
        id="ea_linear_causal",
        exercise="linear_attention",
        points=2,
        description="causal linear_attention with inclusive prefix sums",
        make_cases=_linear_causal_cases,
    ),
    HiddenTest(
        id="ea_performer_features",
        exercise="performer_features",
        points=1,
        description="performer_features: exp(w . x - |x|^2 / 2) / sqrt(m) for a given projection",
        make_cases=_performer_features_cases,
    ),
    HiddenTest(
        id="ea_performer",
        exercise="performer_attention",
        points=1,
        description="performer_attention with a given projection",
        make_cases=_performer_cases,
        level="module",
    ),
    HiddenTest(
        id="ea_linformer",
        exercise="linformer_attention",
        points=1,
        description="linformer_attention projects the keys with proj_k (E) and the values "
        "with proj_v (F)",
        make_cases=_linformer_cases,
    ),
    HiddenTest(
        id="ea_gqa",
        exercise="grouped_query_attention",
        points=2,
        description="grouped_query_attention: query head j uses key/value head j // (h // g)",
        make_cases=_gqa_cases,
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="ea_gqa_masked",
        exercise="grouped_query_attention",
        points=1,
        description="grouped_query_attention with boolean masks; fully masked rows give zeros",
        make_cases=_gqa_masked_cases,
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="ea_kv_cache",
        exercise="kv_cache_step",
        points=2,
        description="kv_cache_step appends to the cache and attends causally over it",
        make_cases=_kv_cases,
        outputs=("out", "cache"),
        forbidden=("sdpa",),
    ),
]

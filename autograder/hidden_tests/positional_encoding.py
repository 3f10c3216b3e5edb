"""Hidden tests for chapter 5, positional encoding (12 points).

Sinusoids, shift matrices and rotary embeddings are compared at the "model" tolerance:
their angles pos * w_i lose absolute precision in float32 as positions grow (about 1e-5 rad
at pos = 200), so two correct float32 implementations can differ by more than the "op"
tolerance. Every catalogued mistake is off by O(1), far outside it.
"""

import torch

from autograder.grading.judging.spec import HiddenTest, Init, case

# ---------------------------------------------------------------------------------- cases


def _sinusoidal_small_cases(g):
    return [
        case(6, 4, label="max_len = 6, d_model = 4"),
        case(12, 8, label="max_len = 12, d_model = 8"),
        case(30, 10, label="max_len = 30, d_model = 10 (an odd number of pairs)"),
        case(1, 2, label="a single position, d_model = 2"),
    ]


def _sinusoidal_wide_cases(g):
    return [
        case(200, 512, label="max_len = 200, d_model = 512"),
        case(64, 96, label="max_len = 64, d_model = 96"),
    ]


def _shift_cases(g):
    return [
        case(1, 2, label="k = 1, d_model = 2"),
        case(3, 4, label="k = 3, d_model = 4"),
        case(10, 16, label="k = 10, d_model = 16"),
        case(0, 8, label="k = 0 (the identity), d_model = 8"),
    ]


def _shift_far_cases(g):
    k = int(torch.randint(20, 60, (), generator=g))
    return [
        case(-3, 8, label="k = -3 (moving back), d_model = 8"),
        case(-25, 32, label="k = -25, d_model = 32"),
        case(k, 64, label="a large k, d_model = 64"),
    ]


def _sinusoidal_error_cases(g):
    return [
        case(10, 7, raises="ValueError", label="d_model = 7 (odd): ValueError"),
        case(4, 1, raises="ValueError", label="d_model = 1 (odd): ValueError"),
    ]


def _rope_error_cases(g):
    return [
        case(torch.randn(4, 7, generator=g), torch.arange(4), raises="ValueError",
             label="x of shape (4, 7), an odd d: ValueError"),
    ]  # fmt: skip


def _learned_cases(g):
    init = Init((12, 8))
    return [
        case(torch.randn(2, 5, 8, generator=g), init=init, label="n = 5 < max_len"),
        case(torch.randn(3, 12, 8, generator=g), init=init, label="n = max_len = 12"),
        case(torch.randn(4, 1, 8, generator=g), init=init, label="n = 1"),
        case(
            torch.randn(1, 7, 8, generator=g), init=init, label="a batch of one, n = 7"
        ),
    ]


def _rope_cases(g):
    return [
        case(
            torch.randn(6, 8, generator=g),
            torch.arange(6),
            label="x of shape (n, d), positions 0..n-1",
        ),
        case(
            torch.randn(2, 5, 16, generator=g),
            torch.randint(0, 50, (5,), generator=g),
            label="x of shape (B, n, d), positions in any order",
        ),
        case(
            torch.randn(3, 4, 2, generator=g),
            torch.arange(4) + 7,
            label="d = 2 (one pair), positions 7..10",
        ),
    ]


def _rope_heads_cases(g):
    return [
        case(
            torch.randn(2, 3, 7, 32, generator=g),
            torch.arange(7) + 100,
            label="x of shape (B, h, n, d), positions 100..106",
        ),
        case(
            torch.randn(2, 2, 5, 8, generator=g),
            torch.arange(5) * 0.5,
            label="fractional float positions",
        ),
        case(
            torch.randn(1, 4, 6, 64, generator=g),
            torch.randint(0, 30, (6,), generator=g),
            label="d = 64",
        ),
    ]


TESTS = [
    HiddenTest(
        id="pe_sinusoidal_values",
        exercise="sinusoidal_encoding",
        points=2,
        description="sin(pos / 10000^(2i/d)) on even and cos on odd dimensions, positions from 0",
        make_cases=_sinusoidal_small_cases,
        level="model",
    ),
    HiddenTest(
        id="pe_sinusoidal_wide",
        exercise="sinusoidal_encoding",
        points=1,
        description="the encoding of wide models (d_model = 96 and 512) over up to 200 positions",
        make_cases=_sinusoidal_wide_cases,
        level="model",
    ),
    HiddenTest(
        id="pe_sinusoidal_errors",
        exercise="sinusoidal_encoding",
        points=1,
        description="a ValueError, as the docstring says, for an odd d_model",
        make_cases=_sinusoidal_error_cases,
    ),
    HiddenTest(
        id="pe_shift_matrix",
        exercise="shift_matrix",
        points=2,
        description="a block-diagonal rotation with PE[pos + k] = shift_matrix(k) @ PE[pos]",
        make_cases=_shift_cases,
        level="model",
    ),
    HiddenTest(
        id="pe_shift_negative_far",
        exercise="shift_matrix",
        points=1,
        description="negative and large offsets k",
        make_cases=_shift_far_cases,
        level="model",
    ),
    HiddenTest(
        id="pe_learned_forward",
        exercise="LearnedPositionalEmbedding",
        points=2,
        description="forward(x) adds the table's rows 0..n-1 to x of shape (B, n, d_model)",
        make_cases=_learned_cases,
        level="module",
    ),
    HiddenTest(
        id="pe_rope_values",
        exercise="apply_rope",
        points=2,
        description="adjacent pairs (2i, 2i+1) rotated counterclockwise by positions * 10000^(-2i/d)",
        make_cases=_rope_cases,
        level="model",
    ),
    HiddenTest(
        id="pe_rope_heads",
        exercise="apply_rope",
        points=2,
        description="rotary embedding of (B, h, n, d) inputs, offset and fractional positions, d = 64",
        make_cases=_rope_heads_cases,
        level="model",
    ),
    HiddenTest(
        id="pe_rope_errors",
        exercise="apply_rope",
        points=1,
        description="a ValueError, as the docstring says, for an odd last dimension",
        make_cases=_rope_error_cases,
    ),
]

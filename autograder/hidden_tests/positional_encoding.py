"""Hidden tests for chapter 5, positional encoding (12 points).

Sinusoids, shift matrices and rotary embeddings are compared at the "model" tolerance:
their angles pos * w_i lose absolute precision in float32 as positions grow (about 1e-5 rad
at pos = 200), so two correct float32 implementations can differ by more than the "op"
tolerance. Every catalogued mistake is off by O(1), far outside it.
"""

import math

import torch

from autograder.grading.spec import HiddenTest, Init, Mistake, case
from solutions import positional_encoding as ref

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
        description="the encoding of wide models (d_model = 96 and 512) over hundreds of positions",
        make_cases=_sinusoidal_wide_cases,
        level="model",
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
]


# ---------------------------------------------------------------- plausible wrong answers


def _wrong_sinusoidal(
    *, swapped=False, exponent="2i/d", cos_odd=False, start=0, halves=False
):
    """sinusoidal_encoding with one deliberate slip."""

    def sinusoidal_encoding(max_len, d_model):
        pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]
        i = torch.arange(d_model // 2, dtype=torch.float64)
        power = {"2i/d": 2 * i / d_model, "i/d": i / d_model, "2i": 2 * i}[exponent]
        sin = torch.sin(pos * 10000.0**-power)
        power_cos = (2 * i + 1) / d_model if cos_odd else power
        cos = torch.cos(pos * 10000.0**-power_cos)
        if swapped:
            sin, cos = cos, sin
        if halves:
            return torch.cat([sin, cos], dim=-1).float()
        return torch.stack([sin, cos], dim=-1).flatten(-2).float()

    return sinusoidal_encoding


def _wrong_shift(*, transposed=False, exponent="2i/d", halves=False):
    """shift_matrix with one deliberate slip."""

    def shift_matrix(k, d_model):
        half = d_model // 2
        i = torch.arange(half, dtype=torch.float64)
        power = {"2i/d": 2 * i / d_model, "i/d": i / d_model, "none": 0 * i}[exponent]
        angle = k * 10000.0**-power
        cos, sin = torch.cos(angle), torch.sin(angle)
        first, second = (
            (torch.arange(half), torch.arange(half) + half)
            if halves
            else (torch.arange(0, d_model, 2), torch.arange(1, d_model, 2))
        )
        m = torch.zeros(d_model, d_model, dtype=torch.float64)
        m[first, first], m[first, second] = cos, sin
        m[second, first], m[second, second] = -sin, cos
        return (m.T if transposed else m).float()

    return shift_matrix


class _LearnedNotAdded(ref.LearnedPositionalEmbedding):
    def forward(self, x):
        return self.embedding(torch.arange(x.size(-2)))


class _LearnedFromOne(ref.LearnedPositionalEmbedding):
    def forward(self, x):
        return x + self.embedding(torch.arange(1, x.size(-2) + 1))


class _LearnedLastRows(ref.LearnedPositionalEmbedding):
    def forward(self, x):
        return x + self.embedding.weight[-x.size(-2) :]


class _LearnedBatchIndex(ref.LearnedPositionalEmbedding):
    def forward(self, x):
        return x + self.embedding(torch.arange(x.size(0)))[:, None, :]


class _LearnedScaled(ref.LearnedPositionalEmbedding):
    def forward(self, x):
        d_model = self.embedding.embedding_dim
        return x * math.sqrt(d_model) + self.embedding(torch.arange(x.size(-2)))


def _wrong_rope(*, sign=1.0, pairing="adjacent", exponent="2i/d", own_positions=False):
    """apply_rope with one deliberate slip. pairing "halves" rotates (x_i, x_{i+d/2});
    "mixed" takes the halves layout's angles (theta repeated twice) with adjacent pairs."""

    def apply_rope(x, positions):
        d = x.size(-1)
        i = torch.arange(d // 2, dtype=torch.float64)
        theta = 10000.0 ** -(2 * i / d if exponent == "2i/d" else i / d)
        if own_positions:
            positions = torch.arange(x.size(-2))
        angle = sign * positions.double()[:, None] * theta  # (n, d/2)
        if pairing == "mixed":
            full = torch.cat([angle, angle], dim=-1)  # (n, d): wrong for adjacent pairs
            cos, sin = torch.cos(full).float(), torch.sin(full).float()
            swapped = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
            return x * cos + swapped * sin
        cos, sin = torch.cos(angle).float(), torch.sin(angle).float()
        if pairing == "halves":
            a, b = x[..., : d // 2], x[..., d // 2 :]
            return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

    return apply_rope


SIN, SHIFT, LEARNED, ROPE = (
    "sinusoidal_encoding",
    "shift_matrix",
    "LearnedPositionalEmbedding",
    "apply_rope",
)
MISTAKES = [
    Mistake(
        SIN,
        "sin and cos swapped",
        "your sines and cosines look swapped: is sin(pos w_i) in the even dimensions 2i and "
        "cos(pos w_i) in the odd dimensions 2i+1? PE[0] must be (0, 1, 0, 1, ...).",
        _wrong_sinusoidal(swapped=True),
    ),
    Mistake(
        SIN,
        "exponent i/d",
        "your frequencies fall too slowly: is the exponent i/d_model with i the pair index? "
        "Pair i (dimensions 2i and 2i+1) uses w_i = 1 / 10000^(2i/d_model).",
        _wrong_sinusoidal(exponent="i/d"),
    ),
    Mistake(
        SIN,
        "exponent without /d_model",
        "all pairs but the first look frozen at sin = 0, cos = 1: did you forget to divide "
        "the exponent by d_model? w_i = 1 / 10000^(2i/d_model).",
        _wrong_sinusoidal(exponent="2i"),
    ),
    Mistake(
        SIN,
        "cosine frequency from the odd index",
        "your cosines use a slightly different frequency from their sines: did you compute "
        "10000^(j/d_model) for every dimension j? Dimensions 2i and 2i+1 share w_i = "
        "1 / 10000^(2i/d_model).",
        _wrong_sinusoidal(cos_odd=True),
    ),
    Mistake(
        SIN,
        "positions start at 1",
        "your encoding looks shifted by one position: do your positions start at 0? Row 0 "
        "is (0, 1, 0, 1, ...).",
        _wrong_sinusoidal(start=1),
    ),
    Mistake(
        SIN,
        "sines in one half, cosines in the other",
        "your sines fill the first half and your cosines the second: did you concatenate "
        "them? Interleave them, sin on the even dimensions 0, 2, 4, ... and cos on the odd "
        "ones 1, 3, 5, ...",
        _wrong_sinusoidal(halves=True),
    ),
    Mistake(
        SHIFT,
        "transposed",
        "your matrix rotates the wrong way (it looks transposed): is row 2i (.., cos w_i k, "
        "sin w_i k, ..) and row 2i+1 (.., -sin w_i k, cos w_i k, ..)? That is what "
        "sin(a + b) = sin a cos b + cos a sin b gives.",
        _wrong_shift(transposed=True),
    ),
    Mistake(
        SHIFT,
        "exponent i/d",
        "your rotation angles use the wrong frequencies: is the exponent 2i/d_model, with i "
        "counting pairs? Block i rotates by w_i k, w_i = 1 / 10000^(2i/d_model).",
        _wrong_shift(exponent="i/d"),
    ),
    Mistake(
        SHIFT,
        "the same angle in every block",
        "every block rotates by the same angle: did you multiply k by each pair's own "
        "frequency w_i = 1 / 10000^(2i/d_model)?",
        _wrong_shift(exponent="none"),
    ),
    Mistake(
        SHIFT,
        "blocks on the halves",
        "your rotations pair dimension i with i + d_model/2: did you borrow RoPE's halves "
        "layout? The encoding keeps sin and cos of one frequency in adjacent dimensions "
        "(2i, 2i+1), so each 2x2 block sits on the diagonal.",
        _wrong_shift(halves=True),
    ),
    Mistake(
        LEARNED,
        "positions not added",
        "your forward returns only the positional vectors: did you add them to x? Return x "
        "plus the vectors of positions 0..n-1, with the shape of x.",
        _LearnedNotAdded,
    ),
    Mistake(
        LEARNED,
        "positions start at 1",
        "your positions look shifted by one: does the first token (position 0) get row 0 "
        "of the table?",
        _LearnedFromOne,
    ),
    Mistake(
        LEARNED,
        "last rows of the table",
        "did you take the last n rows of the table? Position p gets row p: take rows "
        "0..n-1.",
        _LearnedLastRows,
    ),
    Mistake(
        LEARNED,
        "batch index as position",
        "your positions follow the batch dimension: did you count along dimension 0? A "
        "token's position is its index along dimension -2 (the sequence), the same in every "
        "sequence of the batch.",
        _LearnedBatchIndex,
    ),
    Mistake(
        LEARNED,
        "x scaled by sqrt(d_model)",
        "x looks multiplied by sqrt(d_model): did you scale the token vectors? This module "
        "only adds the positional vectors; scaling embeddings is the caller's business.",
        _LearnedScaled,
    ),
    Mistake(
        ROPE,
        "rotated the wrong way",
        "your pairs rotate the wrong way (clockwise): is x'[2i] = x[2i] cos - x[2i+1] sin "
        "and x'[2i+1] = x[2i] sin + x[2i+1] cos?",
        _wrong_rope(sign=-1.0),
    ),
    Mistake(
        ROPE,
        "halves instead of adjacent pairs",
        "did you rotate dimension i with i + d/2 (the GPT-NeoX / Hugging Face LLaMA "
        "layout)? This chapter follows RoFormer and rotates adjacent pairs (x[2i], x[2i+1]).",
        _wrong_rope(pairing="halves"),
    ),
    Mistake(
        ROPE,
        "frequency exponent i/d",
        "your angles use the wrong frequencies: is theta_i = 10000^(-2i/d), with i "
        "counting pairs (not dimensions)?",
        _wrong_rope(exponent="i/d"),
    ),
    Mistake(
        ROPE,
        "half layout's angles on adjacent pairs",
        "the two members of a pair turn by different angles: did you repeat the "
        "frequencies as cat([theta, theta]) (the halves layout) while rotating adjacent "
        "pairs? Dimensions 2i and 2i+1 share theta_i: repeat each frequency twice in a row.",
        _wrong_rope(pairing="mixed"),
    ),
    Mistake(
        ROPE,
        "positions ignored",
        "your output ignores the positions argument (it looks like positions 0..n-1): did "
        "you rotate token j by positions[j] * theta_i?",
        _wrong_rope(own_positions=True),
    ),
]

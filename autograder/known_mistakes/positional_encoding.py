"""Known mistakes of positional encoding: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import math

import torch

from autograder.grading.judging.spec import Mistake
from solutions import positional_encoding as ref


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

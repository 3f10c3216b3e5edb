"""Chapter 5, positional encoding: the references against the papers' formulas computed
independently, the properties the chapter teaches, and tests of the hidden tests with
wrong and correct answers written outside the mistake catalogue."""

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autograder.grading.judging.prepare import generator
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.judging.tolerances import LEVELS
from solutions import positional_encoding as pe
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    verdicts,
    wrong_answers,
)

CHAPTER = "05_positional_encoding"


def _paper_encoding(max_len, d_model):
    """Vaswani et al. (2017), section 3.5, entry by entry in float64."""
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(d_model // 2):
            table[pos, 2 * i] = math.sin(pos / 10000 ** (2 * i / d_model))
            table[pos, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / d_model))
    return table


def _complex_rope(x, positions):
    """RoFormer's complex form: (x_2i + i x_2i+1) * exp(i m theta_i), in numpy complex128."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)  # (d/2,)
    z = x[..., 0::2] + 1j * x[..., 1::2]  # (..., n, d/2)
    z = z * np.exp(1j * np.asarray(positions, dtype=np.float64)[:, None] * theta)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


# ------------------------------------------------------------------------ the references


@pytest.mark.parametrize("max_len, d_model", [(1, 2), (7, 4), (50, 10), (300, 128)])
def test_sinusoidal_encoding_is_the_papers_formula(max_len, d_model):
    table = pe.sinusoidal_encoding(max_len, d_model)
    assert table.shape == (max_len, d_model) and table.dtype == torch.float32
    np.testing.assert_allclose(
        table.numpy(), _paper_encoding(max_len, d_model), atol=1e-6
    )


def test_sinusoidal_encoding_matches_the_sources_pytorch_version():
    """The exp/log form of the annotated Transformer gives the same table."""
    max_len, d_model = 64, 32
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    div_term = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float64)
        * -(math.log(10000.0) / d_model)
    )
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = (
        torch.sin(position * div_term),
        torch.cos(position * div_term),
    )
    torch.testing.assert_close(pe.sinusoidal_encoding(max_len, d_model), table.float())


def test_sinusoidal_worked_numbers():
    table = pe.sinusoidal_encoding(3, 4)
    expected = [
        [0, 1, 0, 1],
        [0.841, 0.540, 0.010, 1.000],
        [0.909, -0.416, 0.020, 1.000],
    ]
    np.testing.assert_allclose(table.numpy(), expected, atol=5e-4)
    wide = pe.sinusoidal_encoding(500, 64)
    assert bool((wide.abs() <= 1).all())
    torch.testing.assert_close(wide.norm(dim=-1), torch.full((500,), math.sqrt(32)))


@pytest.mark.parametrize("d_model", [2, 8, 64])
def test_shift_matrix_moves_every_position_by_k(d_model):
    table = torch.from_numpy(_paper_encoding(400, d_model))
    for k in range(-80, 81, 7):
        m = pe.shift_matrix(k, d_model).double()
        first, last = max(0, -k), min(400, 400 - k)
        moved = table[first:last] @ m.T  # row pos: M(k) @ PE[pos]
        torch.testing.assert_close(
            moved, table[first + k : last + k], atol=1e-5, rtol=0
        )


def test_shift_matrix_is_a_block_diagonal_rotation_group():
    d = 16
    blocks = torch.block_diag(*[torch.ones(2, 2)] * (d // 2)).bool()
    for k in (-5, 0, 1, 9, 40):
        m = pe.shift_matrix(k, d)
        assert m.shape == (d, d) and m.dtype == torch.float32
        assert bool((m[~blocks] == 0).all())
        torch.testing.assert_close(m @ m.T, torch.eye(d), atol=1e-6, rtol=0)
        torch.testing.assert_close(pe.shift_matrix(-k, d), m.T)
    torch.testing.assert_close(pe.shift_matrix(0, d), torch.eye(d))
    torch.testing.assert_close(
        pe.shift_matrix(3, d) @ pe.shift_matrix(11, d),
        pe.shift_matrix(14, d),
        atol=1e-6,
        rtol=0,
    )


def test_dot_products_of_codes_depend_only_on_the_offset():
    table = pe.sinusoidal_encoding(300, 32).double()
    omegas = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    for k in (0, 1, 10, 77):
        dots = (table[: 300 - k] * table[k:]).sum(-1)
        torch.testing.assert_close(
            dots, torch.cos(omegas * k).sum().expand_as(dots), atol=1e-5, rtol=0
        )


def test_learned_embedding_adds_rows_of_its_table():
    torch.manual_seed(0)
    layer = pe.LearnedPositionalEmbedding(max_len=9, d_model=5)
    assert {n: tuple(p.shape) for n, p in layer.named_parameters()} == {
        "embedding.weight": (9, 5)
    }
    x = torch.randn(3, 6, 5)
    torch.testing.assert_close(layer(x), x + layer.embedding.weight[:6])
    with pytest.raises(ValueError, match="max_len"):
        layer(torch.randn(1, 10, 5))


def test_learned_embedding_trains_only_the_rows_it_uses():
    layer = pe.LearnedPositionalEmbedding(max_len=9, d_model=5)
    layer(torch.randn(2, 4, 5)).sum().backward()
    grad = layer.embedding.weight.grad
    assert bool((grad[:4] != 0).all()) and bool((grad[4:] == 0).all())


@pytest.mark.parametrize(
    "shape", [(6, 8), (2, 5, 16), (2, 3, 7, 32), (1, 4, 2), (2, 2, 9, 64)]
)
def test_rope_equals_the_complex_number_form(shape):
    torch.manual_seed(1)
    x = torch.randn(*shape)
    positions = torch.randint(0, 200, (shape[-2],))
    np.testing.assert_allclose(
        pe.apply_rope(x, positions).numpy(),
        _complex_rope(x.numpy(), positions.numpy()),
        atol=2e-6,
    )


def test_rope_equals_a_block_rotation_matrix():
    """Adjacent pairs, counterclockwise: the transposed shift matrix's blocks."""
    torch.manual_seed(2)
    x, d = torch.randn(5, 12), 12
    positions = torch.tensor([0, 3, 8, 21, 50])
    expected = torch.stack(
        [pe.shift_matrix(int(m), d).T @ x[j] for j, m in enumerate(positions)]
    )
    torch.testing.assert_close(pe.apply_rope(x, positions), expected, atol=1e-5, rtol=0)


def test_rope_scores_depend_only_on_the_offset():
    torch.manual_seed(3)
    q, k = torch.randn(64).double(), torch.randn(64).double()

    def score(m, n):
        return (
            pe.apply_rope(q[None], torch.tensor([m]))[0]
            @ pe.apply_rope(k[None], torch.tensor([n]))[0]
        ).item()

    for offset in (-30, -1, 0, 2, 45):
        scores = [score(m, m - offset) for m in (offset + 1, 60, 333, 1000)]
        assert max(scores) - min(scores) < 1e-9, (offset, scores)
    assert abs(score(5, 0) - score(0, 5)) > 1e-3  # not symmetric in the offset


def test_rope_keeps_norms_fixes_position_zero_and_accepts_floats():
    torch.manual_seed(4)
    x = torch.randn(2, 3, 6, 16)
    out = pe.apply_rope(x, torch.arange(6) * 7)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out[..., 0, :], x[..., 0, :])
    half = pe.apply_rope(x, torch.arange(6) * 0.5)
    np.testing.assert_allclose(
        half.numpy(), _complex_rope(x.numpy(), np.arange(6) * 0.5), atol=2e-6
    )


def test_rope_halves_layout_is_a_permutation_of_adjacent_pairs():
    """What the chapter claims about GPT-NeoX / Hugging Face LLaMA's layout."""
    torch.manual_seed(5)
    d, x = 8, torch.randn(4, 8)
    positions = torch.arange(4) * 3
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None] * theta
    cos, sin = torch.cos(angle).float(), torch.sin(angle).float()
    a, b = x[:, : d // 2], x[:, d // 2 :]
    halves = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    to_adjacent = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], -1)
    to_adjacent = to_adjacent.flatten()  # adjacent slot 2i <- i, 2i+1 <- i + d/2
    adjacent = pe.apply_rope(x[:, to_adjacent], positions)
    torch.testing.assert_close(adjacent[:, torch.argsort(to_adjacent)], halves)


def test_references_refuse_an_odd_width():
    """What the docstrings say: sines and cosines come in pairs, an odd width is an error."""
    for call in (
        lambda: pe.sinusoidal_encoding(5, 7),
        lambda: pe.shift_matrix(2, 7),
        lambda: pe.apply_rope(torch.randn(3, 7), torch.arange(3)),
    ):
        with pytest.raises(ValueError, match="even"):
            call()


def test_rope_keeps_gradients_and_device_of_its_input():
    x = torch.randn(2, 5, 8, requires_grad=True)
    pe.apply_rope(x, torch.arange(5)).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())  # a rotation: |Rx|^2 = |x|^2


# ----------------------------------------------- wrong answers outside the mistake catalogue


def _sin_transposed(max_len, d_model):
    return pe.sinusoidal_encoding(max_len, d_model).T.contiguous()


def _sin_base_1000(max_len, d_model):
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for j in range(d_model):
            angle = pos / 1000 ** (2 * (j // 2) / d_model)
            table[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return torch.from_numpy(table).float()


def _sin_cos_from_sqrt(max_len, d_model):
    table = pe.sinusoidal_encoding(max_len, d_model)
    table[:, 1::2] = (1 - table[:, 0::2] ** 2).sqrt()  # loses the sign of the cosine
    return table


def _sin_numpy_array(max_len, d_model):
    return pe.sinusoidal_encoding(max_len, d_model).numpy()


def _sin_normalised_positions(max_len, d_model):
    position = torch.linspace(0, 1, max_len, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return (
        torch.stack([torch.sin(position * omega), torch.cos(position * omega)], -1)
        .flatten(-2)
        .float()
    )


def _shift_identity(k, d_model):
    return torch.eye(d_model)


def _shift_off_by_one(k, d_model):
    return pe.shift_matrix(k + 1, d_model)


def _shift_double_angle(k, d_model):
    return pe.shift_matrix(2 * k, d_model)


def _shift_degrees(k, d_model):
    return pe.shift_matrix(k * math.pi / 180, d_model)


class _LearnedOwnName(torch.nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(max_len, d_model))

    def forward(self, x):
        return x + self.table[: x.size(-2)]


class _LearnedWholeTable(pe.LearnedPositionalEmbedding):
    def forward(self, x):
        return x + self.embedding.weight[: x.size(1)].sum(
            0
        )  # one vector for all positions


class _LearnedConcatenated(pe.LearnedPositionalEmbedding):
    def forward(self, x):
        positions = self.embedding.weight[: x.size(-2)].expand_as(x)
        return torch.cat([x, positions], dim=-1)


class _LearnedReturnsNothing(pe.LearnedPositionalEmbedding):
    def forward(self, x):
        x += self.embedding.weight[: x.size(-2)]


def _rope_cos_only(x, positions):
    d = x.size(-1)
    theta = 10000.0 ** (-torch.arange(0, d, 2) / d)
    cos = torch.cos(positions[:, None] * theta).repeat_interleave(2, -1)
    return x * cos


def _rope_first_half_of_pairs(x, positions):
    out = pe.apply_rope(x, positions)
    d = x.size(-1)
    out[..., d // 2 :] = x[..., d // 2 :]
    return out


def _rope_reversed_positions(x, positions):
    return pe.apply_rope(x, positions.flip(0))


def _rope_normalised_positions(x, positions):
    return pe.apply_rope(x, positions / x.size(-2))


def _rope_base_100(x, positions):
    d = x.size(-1)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    theta = 100.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rotated = z * torch.polar(
        torch.ones_like(theta), positions.double()[:, None] * theta
    )
    return torch.view_as_real(rotated).flatten(-2).float()


INDEPENDENT_WRONG_ANSWERS = {
    "sinusoidal_encoding": {
        _sin_transposed: ["pe_sinusoidal_values", "pe_sinusoidal_wide"],
        _sin_base_1000: ["pe_sinusoidal_values", "pe_sinusoidal_wide"],
        _sin_cos_from_sqrt: ["pe_sinusoidal_values", "pe_sinusoidal_wide"],
        _sin_numpy_array: ["pe_sinusoidal_values", "pe_sinusoidal_wide"],
        _sin_normalised_positions: ["pe_sinusoidal_values", "pe_sinusoidal_wide"],
    },
    "shift_matrix": {
        _shift_identity: ["pe_shift_matrix", "pe_shift_negative_far"],
        _shift_off_by_one: ["pe_shift_matrix", "pe_shift_negative_far"],
        _shift_double_angle: ["pe_shift_matrix", "pe_shift_negative_far"],
        _shift_degrees: ["pe_shift_matrix", "pe_shift_negative_far"],
    },
    "LearnedPositionalEmbedding": {
        _LearnedOwnName: ["pe_learned_forward"],
        _LearnedWholeTable: ["pe_learned_forward"],
        _LearnedConcatenated: ["pe_learned_forward"],
        _LearnedReturnsNothing: ["pe_learned_forward"],
    },
    "apply_rope": {
        _rope_cos_only: ["pe_rope_values", "pe_rope_heads"],
        _rope_first_half_of_pairs: ["pe_rope_values", "pe_rope_heads"],
        _rope_reversed_positions: ["pe_rope_values", "pe_rope_heads"],
        _rope_normalised_positions: ["pe_rope_values", "pe_rope_heads"],
        _rope_base_100: ["pe_rope_values", "pe_rope_heads"],
    },
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails(CHAPTER, pe, exercise, wrong, test_ids)


def test_misnamed_learned_table_is_explained():
    tests = load_chapter_tests(CHAPTER)
    namespace = {**vars(pe), "LearnedPositionalEmbedding": _LearnedOwnName}
    message = verdicts(tests, namespace, 0)["pe_learned_forward"].message
    assert "embedding.weight" in message and "table" in message


# ---------------------------------------------- correct answers in other styles must pass


def _even_width(width_of):
    """The docstrings' contract, which an independent answer states before its math: an
    odd width raises ValueError."""

    def wrap(answer):
        @functools.wraps(answer)
        def checked(*args):
            if width_of(*args) % 2:
                raise ValueError(f"the width must be even, got {width_of(*args)}")
            return answer(*args)

        return checked

    return wrap


_even_d_model = _even_width(lambda max_len, d_model: d_model)
_even_last_dimension = _even_width(lambda x, positions: x.size(-1))


@_even_d_model
def _sin_numpy_loops(max_len, d_model):
    return torch.from_numpy(_paper_encoding(max_len, d_model)).float()


@_even_d_model
def _sin_float32_exp_log(max_len, d_model):
    """The annotated Transformer's float32 recipe: the hidden tests' tolerance allows it."""
    table = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table


def _sin_float64(max_len, d_model):
    return pe.sinusoidal_encoding(max_len, d_model).double()


def _shift_block_diag(k, d_model):
    blocks = []
    for i in range(d_model // 2):
        a = k / 10000 ** (2 * i / d_model)
        blocks.append(
            torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
        )
    return torch.block_diag(*blocks)


def _shift_numpy_loops(k, d_model):
    m = np.zeros((d_model, d_model))
    for i in range(d_model // 2):
        a = k * 10000.0 ** (-2 * i / d_model)
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = np.cos(a), np.sin(a)
        m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -np.sin(a), np.cos(a)
    return torch.from_numpy(m).float()


class _LearnedFunctional(torch.nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.embedding = torch.nn.Embedding(max_len, d_model)

    def forward(self, x):
        batch, n = x.shape[0], x.shape[1]
        positions = torch.arange(n).expand(batch, n)  # (B, n)
        return x + F.embedding(positions, self.embedding.weight)


@_even_last_dimension
def _rope_torch_complex(x, positions):
    d = x.size(-1)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    theta = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    rotation = torch.polar(
        torch.ones(len(positions), d // 2), positions[:, None] * theta
    )
    return torch.view_as_real(z * rotation).flatten(-2)


@_even_last_dimension
def _rope_rotate_pairs_einsum(x, positions):
    d = x.size(-1)
    theta = 10000 ** (-torch.arange(0, d, 2) / d)
    angle = positions.float()[:, None] * theta  # (n, d/2)
    rotation = torch.stack(
        [
            torch.stack([angle.cos(), -angle.sin()], -1),
            torch.stack([angle.sin(), angle.cos()], -1),
        ],
        -2,
    )  # (n, d/2, 2, 2)
    pairs = x.reshape(*x.shape[:-1], d // 2, 2)
    return torch.einsum("npij,...npj->...npi", rotation, pairs).flatten(-2)


@_even_last_dimension
def _rope_elementwise_float32(x, positions):
    """RoFormer's eq. (34): x * cos + rotate(x) * sin, all in float32."""
    d = x.size(-1)
    theta = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    angle = (positions.float()[:, None] * theta).repeat_interleave(2, dim=-1)  # (n, d)
    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    return x * angle.cos() + rotated * angle.sin()


@_even_d_model
def _sin_float32_division(max_len, d_model):
    """pos / 10000^(2i/d), every step in float32."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angle = position / 10000 ** (two_i / d_model)
    return torch.stack([angle.sin(), angle.cos()], -1).flatten(-2)


def _shift_float32(k, d_model):
    """The block rotation with every angle computed in float32."""
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    angle = torch.tensor(float(k)) * omega
    blocks = [
        torch.stack([torch.stack([c, s]), torch.stack([-s, c])])
        for c, s in zip(angle.cos(), angle.sin(), strict=True)
    ]
    return torch.block_diag(*blocks)


INDEPENDENT_CORRECT_ANSWERS = {
    "sinusoidal_encoding": [
        _sin_numpy_loops,
        _sin_float32_exp_log,
        _sin_float32_division,
        _sin_float64,
    ],
    "shift_matrix": [_shift_block_diag, _shift_numpy_loops, _shift_float32],
    "LearnedPositionalEmbedding": [_LearnedFunctional],
    "apply_rope": [
        _rope_torch_complex,
        _rope_rotate_pairs_einsum,
        _rope_elementwise_float32,
    ],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, pe, exercise, right, seed)


# ------------------------------------- float32 against float64: the tolerance has a margin

# Answers computed entirely in float32, against the reference (float64 angles, then cast).
_FLOAT32 = {
    "sinusoidal_encoding": [_sin_float32_exp_log, _sin_float32_division],
    "shift_matrix": [_shift_float32],
    "apply_rope": [_rope_elementwise_float32],
}


def _hidden_calls(test, seed):
    """The (args, kwargs) of every case the hidden test draws with this seed that has a
    value to compare (not the arguments the docstring refuses)."""
    cases = test.make_cases(generator(seed, test.id))
    return [(c.args, c.kwargs) for c in cases if c.raises is None]


def _excess(got, expected, tolerance):
    """max over entries of |got - expected| / (atol + rtol |expected|): <= 1 passes."""
    got, expected = torch.as_tensor(got).double(), torch.as_tensor(expected).double()
    allowed = tolerance.atol + tolerance.rtol * expected.abs()
    return ((got - expected).abs() / allowed).max().item()


@pytest.mark.parametrize("exercise", sorted(_FLOAT32))
def test_float32_answers_sit_well_inside_the_tolerance_and_mistakes_far_outside(
    exercise,
):
    """The largest inputs the hidden tests draw (200 positions x 512, offsets up to 59,
    positions up to 106) with every seed: a pure-float32 answer differs from the
    float64-then-cast reference by at most a third of the tolerance, and every catalogued
    mistake of the exercise by at least ten times it on some case of every test."""
    tests = load_chapter_tests(CHAPTER)
    reference = getattr(pe, exercise)
    for test in (t for t in tests.tests if t.exercise == exercise):
        if not _hidden_calls(test, SEEDS[0]):  # a test of the error contract only
            continue
        tolerance = LEVELS[test.level]
        for seed in SEEDS:
            calls = _hidden_calls(test, seed)
            for answer in _FLOAT32[exercise]:
                worst = max(_excess(answer(*a, **k), reference(*a, **k), tolerance)
                            for a, k in calls)  # fmt: skip
                assert worst < 1 / 3, (answer.__name__, test.id, seed, worst)
            for mistake in tests.mistakes_for(exercise):
                worst = max(
                    _excess(mistake.impl(*a, **k), reference(*a, **k), tolerance)
                    for a, k in calls
                )
                assert worst > 10, (mistake.name, test.id, seed, worst)

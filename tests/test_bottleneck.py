"""Chapter 1, the bottleneck: the references against PyTorch and hand computations, and the
hidden tests against answers written independently of the mistake catalogue."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.grading.judging.spec import load_chapter_tests
from solutions import bottleneck as bn

# answers call the reference by its bare name, as a student's notebook would
from solutions.bottleneck import softmax
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    verdicts,
    wrong_answers,
)

CHAPTER = "01_bottleneck"


# ------------------------------------------------------------ the references are correct


class _RecordOps(TorchDispatchMode):
    """Records the names of the ATen operators a computation dispatches to."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "shape, dim",
    [
        ((7,), -1),
        ((3, 5), -1),
        ((3, 5), 0),
        ((2, 3, 4), 1),
        ((2, 3, 4), -2),
        ((4, 1), -1),
    ],
)
@pytest.mark.parametrize("scale", [1.0, 100.0, 1000.0])
def test_softmax_equals_torch_softmax(shape, dim, scale):
    torch.manual_seed(0)
    x = torch.randn(*shape) * scale
    torch.testing.assert_close(bn.softmax(x, dim=dim), torch.softmax(x, dim=dim))


def test_softmax_is_shift_invariant_and_finite_on_huge_logits():
    x = torch.tensor([[1.0, 2.0, 3.0]])
    expected = torch.tensor([[math.e**-2, math.e**-1, 1.0]]) / (
        1 + math.e**-1 + math.e**-2
    )
    for shift in (0.0, 1000.0, -1000.0, 1e6):
        torch.testing.assert_close(bn.softmax(x + shift), expected)
    mixed = torch.tensor([[1000.0, -1000.0, 0.0], [-1e4, -1e4, -1e4]])
    out = bn.softmax(mixed)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.sum(-1), torch.ones(2))


def test_softmax_keeps_float64():
    x = torch.randn(3, 4, dtype=torch.float64) * 300
    out = bn.softmax(x, dim=0)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.softmax(x, dim=0))


def test_reference_softmax_does_not_delegate_to_torch_softmax():
    with _RecordOps() as ops:
        bn.softmax(torch.randn(3, 4), dim=0)
        bn.attention_pool(torch.randn(2, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 5))
    assert ops.names and not any("softmax" in name for name in ops.names)


def test_attention_pool_worked_example_by_hand():
    q = torch.tensor([[1.0, 0.0]])
    k = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]]])
    v = torch.tensor([[[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]]])
    context, weights = bn.attention_pool(q, k, v)
    e = [math.exp(1.0), math.exp(0.0), math.exp(2.0)]  # scores (1, 0, 2)
    alpha = [x / sum(e) for x in e]
    expected_context = [
        sum(a * vi[c] for a, vi in zip(alpha, v[0].tolist(), strict=True))
        for c in range(2)
    ]
    torch.testing.assert_close(weights, torch.tensor([alpha]))
    torch.testing.assert_close(context, torch.tensor([expected_context]))
    assert abs(expected_context[0] - 5.7734) < 1e-4  # the numbers quoted in the chapter


def test_attention_pool_equals_sdpa_with_unit_scale_and_a_python_loop():
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 8), torch.randn(4, 6, 8), torch.randn(4, 6, 3)
    context, weights = bn.attention_pool(q, k, v)
    torch.testing.assert_close(
        context, F.scaled_dot_product_attention(q[:, None], k, v, scale=1.0)[:, 0]
    )
    for b in range(4):
        scores = torch.tensor([float(q[b] @ k[b, i]) for i in range(6)])
        alpha = scores.exp() / scores.exp().sum()
        torch.testing.assert_close(weights[b], alpha)
        torch.testing.assert_close(
            context[b], sum(alpha[i] * v[b, i] for i in range(6))
        )


def test_attention_pool_large_scores_select_the_matching_value():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 8), torch.randn(3, 5, 8), torch.randn(3, 5, 2)
    k[:, 4] = 50 * q
    context, weights = bn.attention_pool(q, k, v)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(context, v[:, 4])


def _gru_by_hand(cell: nn.GRUCell, x, h):
    """The GRU update of Cho et al. (2014), in PyTorch's gate order (r, z, n)."""
    w_ir, w_iz, w_in = cell.weight_ih.chunk(3)
    w_hr, w_hz, w_hn = cell.weight_hh.chunk(3)
    b_ir, b_iz, b_in = cell.bias_ih.chunk(3)
    b_hr, b_hz, b_hn = cell.bias_hh.chunk(3)
    r = torch.sigmoid(x @ w_ir.T + b_ir + h @ w_hr.T + b_hr)
    z = torch.sigmoid(x @ w_iz.T + b_iz + h @ w_hz.T + b_hz)
    n = torch.tanh(x @ w_in.T + b_in + r * (h @ w_hn.T + b_hn))
    return (1 - z) * n + z * h


@torch.no_grad()
def test_decoder_step_follows_bahdanau_equations():
    torch.manual_seed(0)
    step = bn.Seq2SeqAttentionDecoderStep(vocab_size=9, emb_dim=5, hidden_dim=6)
    token, s_prev, h = torch.tensor([1, 8, 0]), torch.randn(3, 6), torch.randn(3, 7, 6)
    logits, s_new, weights = step(token, s_prev, h)

    e = torch.einsum("bd,bjd->bj", s_prev, h)  # e_tj = s_{t-1} . h_j
    alpha = e.exp() / e.exp().sum(-1, keepdim=True)
    c = torch.einsum("bj,bjd->bd", alpha, h)  # c_t = sum_j alpha_tj h_j
    y_prev = step.embedding.weight[token]
    s_expected = _gru_by_hand(step.gru, torch.cat([y_prev, c], -1), s_prev)
    logits_expected = torch.cat([s_expected, c], -1) @ step.out.weight.T + step.out.bias
    torch.testing.assert_close(weights, alpha)
    torch.testing.assert_close(s_new, s_expected)
    torch.testing.assert_close(logits, logits_expected)
    assert {n: tuple(p.shape) for n, p in step.named_parameters()} == {
        "embedding.weight": (9, 5),
        "gru.weight_ih": (18, 11),
        "gru.weight_hh": (18, 6),
        "gru.bias_ih": (18,),
        "gru.bias_hh": (18,),
        "out.weight": (9, 12),
        "out.bias": (9,),
    }


@torch.no_grad()
def test_decoder_step_with_one_memory_slot_is_the_fixed_context_decoder():
    torch.manual_seed(0)
    step = bn.Seq2SeqAttentionDecoderStep(vocab_size=9, emb_dim=5, hidden_dim=6)
    token, hidden, c = torch.tensor([1, 2]), torch.randn(2, 6), torch.randn(2, 6)
    logits, new_hidden, weights = step(token, hidden, c[:, None])
    expected_hidden = step.gru(torch.cat([step.embedding(token), c], -1), hidden)
    torch.testing.assert_close(weights, torch.ones(2, 1))
    torch.testing.assert_close(new_hidden, expected_hidden)
    torch.testing.assert_close(logits, step.out(torch.cat([expected_hidden, c], -1)))


# --------------------------------------------- wrong answers outside the mistake catalogue


def _softmax_float64_naive(x, dim=-1):
    e = x.double().exp()  # float64 still overflows past exp(709)
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def _softmax_clamped(x, dim=-1):
    e = x.clamp(-80, 80).exp()  # finite, but wrong once logits pass the clamp
    return e / e.sum(dim, keepdim=True)


def _softmax_numpy(x, dim=-1):
    return softmax(x, dim).numpy()


def _softmax_sigmoid(x, dim=-1):
    s = torch.sigmoid(x)
    return s / s.sum(dim, keepdim=True)


def _softmax_temperature(x, dim=-1):
    return softmax(x / 2, dim)


def _softmax_log(x, dim=-1):
    shifted = x - x.amax(dim, keepdim=True)
    return shifted - shifted.exp().sum(dim, keepdim=True).log()


def _pool_outputs_swapped(query, keys, values):
    context, weights = bn.attention_pool(query, keys, values)
    return weights, context


def _pool_context_only(query, keys, values):
    return bn.attention_pool(query, keys, values)[0]


def _pool_weights_keepdim(query, keys, values):
    context, weights = bn.attention_pool(query, keys, values)
    return context, weights.unsqueeze(1)


def _pool_cosine(query, keys, values):
    scores = F.cosine_similarity(keys, query[:, None], dim=-1)
    weights = bn.softmax(scores)
    return (weights[..., None] * values).sum(1), weights


def _pool_negative_distance(query, keys, values):
    scores = -((keys - query[:, None]) ** 2).sum(-1)
    weights = bn.softmax(scores)
    return (weights[..., None] * values).sum(1), weights


class _StepWithGRULayer(nn.Module):
    """nn.GRU instead of nn.GRUCell: the parameters get other names (weight_ih_l0)."""

    def __init__(self, vocab_size, emb_dim, hidden_dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_dim)
        self.gru = nn.GRU(emb_dim + hidden_dim, hidden_dim, batch_first=True)
        self.out = nn.Linear(2 * hidden_dim, vocab_size)

    def forward(self, token, hidden, encoder_outputs):
        context, weights = bn.attention_pool(hidden, encoder_outputs, encoder_outputs)
        x = torch.cat([self.embedding(token), context], -1)[:, None]
        _, new = self.gru(x, hidden[None])
        new = new[0]
        return self.out(torch.cat([new, context], -1)), new, weights


class _StepOutputFromHiddenOnly(bn.Seq2SeqAttentionDecoderStep):
    def __init__(self, vocab_size, emb_dim, hidden_dim):
        super().__init__(vocab_size, emb_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim, vocab_size)

    def forward(self, token, hidden, encoder_outputs):
        context, weights = bn.attention_pool(hidden, encoder_outputs, encoder_outputs)
        new = self.gru(torch.cat([self.embedding(token), context], -1), hidden)
        return self.out(new), new, weights


class _StepNoOutputBias(bn.Seq2SeqAttentionDecoderStep):
    def __init__(self, vocab_size, emb_dim, hidden_dim):
        super().__init__(vocab_size, emb_dim, hidden_dim)
        self.out = nn.Linear(2 * hidden_dim, vocab_size, bias=False)


class _StepAttendsTwice(bn.Seq2SeqAttentionDecoderStep):
    """Updates the state, then attends again with the NEW state for the output (Luong-like)."""

    def forward(self, token, hidden, encoder_outputs):
        context, _ = bn.attention_pool(hidden, encoder_outputs, encoder_outputs)
        new = self.gru(torch.cat([self.embedding(token), context], -1), hidden)
        context, weights = bn.attention_pool(new, encoder_outputs, encoder_outputs)
        return self.out(torch.cat([new, context], -1)), new, weights


class _StepReturnsProbabilities(bn.Seq2SeqAttentionDecoderStep):
    def forward(self, token, hidden, encoder_outputs):
        logits, new, weights = super().forward(token, hidden, encoder_outputs)
        return bn.softmax(logits), new, weights


class _StepTanhContext(bn.Seq2SeqAttentionDecoderStep):
    def forward(self, token, hidden, encoder_outputs):
        context, weights = bn.attention_pool(hidden, encoder_outputs, encoder_outputs)
        context = torch.tanh(context)
        new = self.gru(torch.cat([self.embedding(token), context], -1), hidden)
        return self.out(torch.cat([new, context], -1)), new, weights


SOFTMAX_TESTS = ["bn_softmax_values", "bn_softmax_stable"]
POOL_TESTS = ["bn_attention_pool", "bn_attention_pool_edge_cases"]
STEP_TESTS = ["bn_decoder_step", "bn_decoder_step_edge_cases"]

INDEPENDENT_WRONG_ANSWERS = {
    "softmax": {
        _softmax_float64_naive: ["bn_softmax_stable"],
        _softmax_clamped: ["bn_softmax_stable"],
        _softmax_numpy: SOFTMAX_TESTS,
        _softmax_sigmoid: SOFTMAX_TESTS,
        _softmax_temperature: SOFTMAX_TESTS,
        _softmax_log: SOFTMAX_TESTS,
    },
    "attention_pool": {
        _pool_outputs_swapped: POOL_TESTS,
        _pool_context_only: POOL_TESTS,
        _pool_weights_keepdim: POOL_TESTS,
        _pool_cosine: POOL_TESTS,
        _pool_negative_distance: POOL_TESTS,
    },
    "Seq2SeqAttentionDecoderStep": {
        _StepWithGRULayer: STEP_TESTS,
        _StepOutputFromHiddenOnly: STEP_TESTS,
        _StepNoOutputBias: STEP_TESTS,
        _StepAttendsTwice: ["bn_decoder_step"],
        _StepReturnsProbabilities: STEP_TESTS,
        _StepTanhContext: STEP_TESTS,
    },
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails(CHAPTER, bn, exercise, wrong, test_ids)


def test_misnamed_decoder_parameters_are_explained():
    tests = load_chapter_tests(CHAPTER)
    namespace = {**vars(bn), "Seq2SeqAttentionDecoderStep": _StepWithGRULayer}
    message = verdicts(tests, namespace, 0, [tests.test("bn_decoder_step")])[
        "bn_decoder_step"
    ].message
    assert "gru.weight_ih" in message


# ------------------------------------------------- correct answers in other styles pass


def _softmax_logsumexp(x, dim=-1):
    return (x - x.logsumexp(dim, keepdim=True)).exp()


def _softmax_float64(x, dim=-1):
    x64 = x.double()
    e = torch.exp(x64 - x64.max(dim=dim, keepdim=True).values)
    return (e * e.sum(dim=dim, keepdim=True).reciprocal()).float()


def _softmax_movedim(x, dim=-1):
    last = x.movedim(dim, -1)
    e = (last - last.max(-1, keepdim=True).values).exp()
    return (e / e.sum(-1, keepdim=True)).movedim(-1, dim)


def _softmax_numpy_roundtrip(x, dim=-1):
    a = x.numpy().astype(np.float64)
    e = np.exp(a - a.max(axis=dim, keepdims=True))
    return torch.from_numpy(e / e.sum(axis=dim, keepdims=True)).float()


def _pool_bmm(query, keys, values):
    scores = torch.bmm(keys, query.unsqueeze(2)).squeeze(2)
    weights = _softmax_logsumexp(scores)
    return torch.bmm(weights.unsqueeze(1), values).squeeze(1), weights


def _pool_einsum_float64(query, keys, values):
    scores = torch.einsum("bd,bnd->bn", query.double(), keys.double())
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    weights = weights / weights.sum(-1, keepdim=True)
    return torch.einsum("bn,bnv->bv", weights, values.double()), weights


class _StepByHand(nn.Module):
    """Same parameters; the GRU and the output layer computed from the formulas."""

    def __init__(self, vocab_size, emb_dim, hidden_dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_dim)
        self.gru = nn.GRUCell(emb_dim + hidden_dim, hidden_dim)
        self.out = nn.Linear(2 * hidden_dim, vocab_size)
        self.register_buffer("steps_taken", torch.zeros((), dtype=torch.long))

    def forward(self, token, hidden, encoder_outputs):
        context, weights = _pool_bmm(hidden, encoder_outputs, encoder_outputs)
        x = torch.cat((F.embedding(token, self.embedding.weight), context), dim=1)
        new = _gru_by_hand(self.gru, x, hidden)
        logits = F.linear(
            torch.cat((new, context), dim=1), self.out.weight, self.out.bias
        )
        return logits, new, weights


INDEPENDENT_CORRECT_ANSWERS = {
    "softmax": [
        _softmax_logsumexp,
        _softmax_float64,
        _softmax_movedim,
        _softmax_numpy_roundtrip,
    ],
    "attention_pool": [_pool_bmm, _pool_einsum_float64],
    "Seq2SeqAttentionDecoderStep": [_StepByHand],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, bn, exercise, right, seed)


def test_chapter_totals_twelve_points():
    assert load_chapter_tests(CHAPTER).max_score == 12

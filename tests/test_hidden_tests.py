"""Tests of the tests: every hidden test passes the reference and fails the stub and
plausible wrong answers, and the feedback names the known mistakes."""

import math

import pytest
import torch

from autograder.grading.spec import load_chapter_tests
from solutions import self_attention as sa
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    verdicts,
    wrong_answers,
)
from tests.conftest import CHAPTERS


@pytest.mark.parametrize("seed", SEEDS)
def test_reference_passes_every_hidden_test(chapter, seed):
    tests = load_chapter_tests(chapter)
    results = verdicts(tests, vars(tests.reference()), seed)
    assert all(v.passed for v in results.values()), {
        k: v.message for k, v in results.items() if not v.passed
    }


def _stub(*args, **kwargs):
    raise NotImplementedError


def test_stub_fails_every_hidden_test(chapter):
    tests = load_chapter_tests(chapter)
    results = verdicts(tests, {name: _stub for name in tests.exercises})
    for test_id, v in results.items():
        assert not v.passed, test_id
        assert "not implemented yet" in v.message


def test_missing_function_fails_with_a_clear_message(chapter):
    tests = load_chapter_tests(chapter)
    for v in verdicts(tests, {}).values():
        assert not v.passed and "does not define" in v.message


@pytest.mark.parametrize("chapter_id", CHAPTERS)
def test_every_hidden_test_fails_at_least_three_known_mistakes(chapter_id):
    tests = load_chapter_tests(chapter_id)
    failed_by = {t.id: [] for t in tests.tests}
    for mistake in tests.mistakes:
        selected = [t for t in tests.tests if t.exercise == mistake.exercise]
        namespace = {**vars(tests.reference()), mistake.exercise: mistake.impl}
        for seed in SEEDS:
            for test_id, v in verdicts(tests, namespace, seed, selected).items():
                if not v.passed:
                    failed_by[test_id].append(mistake.name)
    for test_id, names in failed_by.items():
        assert len(set(names)) >= 3, f"{test_id} fails only on {set(names)}"


@pytest.mark.parametrize("chapter_id", CHAPTERS)
def test_every_known_mistake_is_caught_and_named(chapter_id):
    tests = load_chapter_tests(chapter_id)
    for mistake in tests.mistakes:
        selected = [t for t in tests.tests if t.exercise == mistake.exercise]
        namespace = {**vars(tests.reference()), mistake.exercise: mistake.impl}
        results = verdicts(tests, namespace, 0, selected)
        failing = [v for v in results.values() if not v.passed]
        assert failing, f"no hidden test catches {mistake.exercise}: {mistake.name}"
        assert any(mistake.hint in v.message for v in failing), (
            mistake.name,
            [v.message for v in failing],
        )


# Wrong answers written independently of the mistake catalogue: the hidden tests must catch
# them too, even when the feedback cannot name them.


def _sdpa_outputs_swapped(q, k, v, mask=None):
    out, weights = sa.scaled_dot_product_attention(q, k, v, mask)
    return weights, out


def _sdpa_only_output(q, k, v, mask=None):
    return sa.scaled_dot_product_attention(q, k, v, mask)[0]


def _sdpa_mask_after_softmax(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    if mask is not None:
        weights = weights * mask  # zeroes masked keys but forgets to renormalise
    return weights @ v, weights


def _sdpa_naive_exp(q, k, v, mask=None):
    scores = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)))
    if mask is not None:
        scores = scores * mask
    weights = scores / scores.sum(
        -1, keepdim=True
    )  # overflows on large logits, 0/0 on empty rows
    return weights @ v, weights


def _sdpa_numpy_result(q, k, v, mask=None):
    out, weights = sa.scaled_dot_product_attention(q, k, v, mask)
    return out.numpy(), weights.numpy()


def _sdpa_float64(q, k, v, mask=None):
    return sa.scaled_dot_product_attention(q.double(), k.double(), v.double(), mask)


def _causal_int(n, device=None):
    return sa.causal_mask(n, device).long()


def _causal_list(n, device=None):
    return sa.causal_mask(n, device).tolist()


def _padding_with_lengths_as_n(lengths, n):
    return sa.padding_mask(lengths, int(lengths.max()))


class _SelfAttentionWithBias(sa.SelfAttention):
    def __init__(self, d_model, d_k, d_v):
        torch.nn.Module.__init__(self)
        self.W_q = torch.nn.Linear(d_model, d_k)
        self.W_k = torch.nn.Linear(d_model, d_k)
        self.W_v = torch.nn.Linear(d_model, d_v)


class _SelfAttentionOwnNames(torch.nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.query = torch.nn.Linear(d_model, d_k, bias=False)
        self.key = torch.nn.Linear(d_model, d_k, bias=False)
        self.value = torch.nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
        return sa.scaled_dot_product_attention(
            self.query(x), self.key(x), self.value(x), mask
        )


INDEPENDENT_WRONG_ANSWERS = {
    "scaled_dot_product_attention": {
        _sdpa_outputs_swapped: ["sdpa_basic", "sdpa_masked", "sdpa_edge_cases"],
        _sdpa_only_output: ["sdpa_basic", "sdpa_masked", "sdpa_edge_cases"],
        _sdpa_mask_after_softmax: ["sdpa_masked", "sdpa_edge_cases"],
        _sdpa_naive_exp: ["sdpa_edge_cases"],
        _sdpa_numpy_result: ["sdpa_basic", "sdpa_masked", "sdpa_edge_cases"],
    },
    "causal_mask": {
        _causal_int: ["causal_mask_values"],
        _causal_list: ["causal_mask_values"],
    },
    "padding_mask": {_padding_with_lengths_as_n: ["padding_mask_values"]},
    "SelfAttention": {
        _SelfAttentionWithBias: ["self_attention_module"],
        _SelfAttentionOwnNames: ["self_attention_module"],
    },
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails("03_self_attention", sa, exercise, wrong, test_ids)


class _SelfAttentionWithScaleBuffer(sa.SelfAttention):
    """Correct, with an extra buffer the reference does not have."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__(d_model, d_k, d_v)
        self.register_buffer("scale", torch.tensor(1 / math.sqrt(d_k)))


def test_extra_buffers_in_a_correct_module_are_accepted():
    tests = load_chapter_tests("03_self_attention")
    namespace = {**vars(sa), "SelfAttention": _SelfAttentionWithScaleBuffer}
    assert verdicts(tests, namespace, 0)["self_attention_module"].passed


def test_wrongly_named_parameters_are_explained():
    tests = load_chapter_tests("03_self_attention")
    namespace = {**vars(sa), "SelfAttention": _SelfAttentionOwnNames}
    message = verdicts(tests, namespace, 0)["self_attention_module"].message
    assert "no parameters named W_q.weight" in message and "query.weight" in message


def test_float64_answer_is_accepted():
    """A correct answer computed in float64 is still correct: precision is not a mistake."""
    tests = load_chapter_tests("03_self_attention")
    results = verdicts(
        tests, {**vars(sa), "scaled_dot_product_attention": _sdpa_float64}, 0
    )
    assert all(v.passed for v in results.values())


def test_feedback_shows_no_hidden_inputs():
    """Messages describe differences; they never print tensors from the hidden cases."""
    tests = load_chapter_tests("03_self_attention")
    for mistake in tests.mistakes:
        namespace = {**vars(sa), mistake.exercise: mistake.impl}
        for v in verdicts(tests, namespace, 0).values():
            assert "tensor(" not in v.message and "[[" not in v.message


def test_test_ids_are_unique_across_the_course():
    ids = [t.id for c in CHAPTERS for t in load_chapter_tests(c).tests]
    assert len(ids) == len(set(ids))


# Correct answers written in other styles must pass: the tests judge results, not style.


def _sdpa_einsum_stable(q, k, v, mask=None):
    scores = torch.einsum("...id,...jd->...ij", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    top = scores.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    exp = torch.exp(scores - top)
    total = exp.sum(-1, keepdim=True)
    weights = torch.where(
        total > 0, exp / total.clamp_min(1e-30), torch.zeros_like(exp)
    )
    return torch.einsum("...ij,...jd->...id", weights, v), weights


def _sdpa_inf_then_nan_to_num(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(k.size(-1)))
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(float("-inf")))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return torch.matmul(weights, v), weights


def _causal_by_comparison(n, device=None):
    i = torch.arange(n, device=device)
    return i[:, None] >= i[None, :]


def _padding_by_expand(lengths, n):
    positions = torch.arange(n).expand(len(lengths), n)
    return (positions < lengths.unsqueeze(1)).unsqueeze(-2)


class _SelfAttentionInline(torch.nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.W_q = torch.nn.Linear(d_model, d_k, bias=False)
        self.W_k = torch.nn.Linear(d_model, d_k, bias=False)
        self.W_v = torch.nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
        q, k, v = (x @ w.weight.T for w in (self.W_q, self.W_k, self.W_v))
        return _sdpa_einsum_stable(q, k, v, mask)


INDEPENDENT_CORRECT_ANSWERS = {
    "scaled_dot_product_attention": [_sdpa_einsum_stable, _sdpa_inf_then_nan_to_num],
    "causal_mask": [_causal_by_comparison],
    "padding_mask": [_padding_by_expand],
    "SelfAttention": [_SelfAttentionInline],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes("03_self_attention", sa, exercise, right, seed)


def _sdpa_sparse(q, k, v, mask=None):
    out, weights = sa.scaled_dot_product_attention(q, k, v, mask)
    return out.to_sparse(), weights


def _sdpa_complex(q, k, v, mask=None):
    out, weights = sa.scaled_dot_product_attention(q, k, v, mask)
    return out.to(torch.complex64), weights


def _sdpa_deep(q, k, v, mask=None):
    nested = [q]
    for _ in range(10):
        nested = [nested]
    return nested, {"weights": None}


@pytest.mark.parametrize("strange", [_sdpa_sparse, _sdpa_complex, _sdpa_deep])
def test_strange_outputs_fail_with_a_message(strange):
    tests = load_chapter_tests("03_self_attention")
    selected = [t for t in tests.tests if t.exercise == "scaled_dot_product_attention"]
    namespace = {**vars(sa), "scaled_dot_product_attention": strange}
    for v in verdicts(tests, namespace, 0, selected).values():
        assert not v.passed and v.message

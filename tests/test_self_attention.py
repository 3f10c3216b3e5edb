"""Chapter 3: the reference against PyTorch and the properties the chapter teaches, and
the hidden tests against wrong and right answers written outside the mistake catalogue."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from autograder.grading.judging.spec import load_chapter_tests
from solutions import self_attention as sa

# answers call the reference by its bare name, as a student's notebook would
from solutions.self_attention import scaled_dot_product_attention
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    verdicts,
    wrong_answers,
)

CHAPTER = "03_self_attention"


def _random_mask(*shape, p=0.5):
    mask = torch.rand(*shape) < p
    mask[..., 0] = True  # no fully masked rows: SDPA and ours then must agree exactly
    return mask


@pytest.mark.parametrize(
    "batch, n_q, n_k, d_k, d_v",
    [
        ((), 4, 4, 8, 8),
        ((3,), 5, 7, 8, 3),
        ((2, 4), 6, 6, 16, 16),
        ((2, 3, 2), 1, 9, 4, 5),
    ],
)
def test_sdpa_matches_torch_without_and_with_masks(batch, n_q, n_k, d_k, d_v):
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(*batch, n_q, d_k),
        torch.randn(*batch, n_k, d_k),
        torch.randn(*batch, n_k, d_v),
    )
    out, weights = sa.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert weights.shape == (*batch, n_q, n_k)
    for mask_shape in [
        (n_q, n_k),
        (*batch, n_q, n_k),
        (*batch[:1], *[1] * (len(batch) - 1), 1, n_k),
    ]:
        mask = _random_mask(*mask_shape)
        out, weights = sa.scaled_dot_product_attention(q, k, v, mask)
        torch.testing.assert_close(
            out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        )
        assert bool((weights.masked_select(~mask.expand_as(weights)) == 0).all())


def test_sdpa_weights_are_a_distribution_over_keys():
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 4)
    _, weights = sa.scaled_dot_product_attention(q, k, v, _random_mask(2, 5, 7))
    assert bool((weights >= 0).all())
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    q, k, v = (torch.randn(2, 4, 8, requires_grad=True) for _ in range(3))
    mask = _random_mask(2, 4, 4)
    mask[1, 2] = False
    out, weights = sa.scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[1, 2], torch.zeros(8)) and torch.equal(
        weights[1, 2], torch.zeros(4)
    )
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_a_mask_with_more_leading_dimensions_broadcasts_into_the_outputs():
    # The docstring's convention: q, k, v and the mask broadcast together.
    q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 3)
    masks = _random_mask(2, 4, 6)
    out, weights = sa.scaled_dot_product_attention(q, k, v, masks)
    assert out.shape == (2, 4, 3) and weights.shape == (2, 4, 6)
    for b in range(2):
        one_out, one_weights = sa.scaled_dot_product_attention(q, k, v, masks[b])
        torch.testing.assert_close(out[b], one_out)
        torch.testing.assert_close(weights[b], one_weights)


def test_large_logits_stay_finite():
    q, k, v = (
        torch.randn(2, 5, 16) * 100,
        torch.randn(2, 5, 16) * 100,
        torch.randn(2, 5, 16),
    )
    out, weights = sa.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


def test_causal_mask_matches_torch_is_causal():
    for n in (1, 2, 7):
        mask = sa.causal_mask(n)
        assert mask.dtype == torch.bool and mask.shape == (n, n)
        assert all(
            bool(mask[i, j]) == (j <= i)
            for i, j in itertools.product(range(n), repeat=2)
        )
    q, k, v = torch.randn(3, 6, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 8)
    out, _ = sa.scaled_dot_product_attention(q, k, v, sa.causal_mask(6))
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_padding_mask_marks_real_tokens():
    mask = sa.padding_mask(torch.tensor([0, 2, 4]), 4)
    assert mask.dtype == torch.bool and mask.shape == (3, 1, 4)
    assert mask[:, 0].tolist() == [[False] * 4, [True, True, False, False], [True] * 4]


def _layer(seed=0):
    torch.manual_seed(seed)
    return sa.SelfAttention(d_model=12, d_k=8, d_v=5)


def test_self_attention_is_sdpa_of_three_projections():
    layer, x = _layer(), torch.randn(2, 6, 12)
    out, weights = layer(x)
    q, k, v = x @ layer.W_q.weight.T, x @ layer.W_k.weight.T, x @ layer.W_v.weight.T
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert weights.shape == (2, 6, 6)
    assert sum(p.numel() for p in layer.parameters()) == 12 * (8 + 8 + 5)


def test_self_attention_is_permutation_equivariant():
    layer, x = _layer(), torch.randn(2, 6, 12)
    perm = torch.randperm(6)
    out, weights = layer(x)
    out_p, weights_p = layer(x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(weights_p, weights[:, perm][:, :, perm])


def test_self_attention_with_causal_mask_is_causal():
    layer, x = _layer(), torch.randn(2, 6, 12)
    for t in range(6):
        changed = x.clone()
        changed[:, t] = torch.randn(2, 12)
        before, _ = layer(x, sa.causal_mask(6))
        after, _ = layer(changed, sa.causal_mask(6))
        torch.testing.assert_close(
            after[:, :t], before[:, :t]
        )  # earlier positions unaffected
        assert not torch.allclose(
            after[:, t], before[:, t]
        )  # the changed position is affected


# Wrong answers written independently of the mistake catalogue: the hidden tests must catch
# them too, even when the feedback cannot name them.


def _sdpa_outputs_swapped(q, k, v, mask=None):
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    return weights, out


def _sdpa_only_output(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask)[0]


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
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    return out.numpy(), weights.numpy()


def _sdpa_float64(q, k, v, mask=None):
    return scaled_dot_product_attention(q.double(), k.double(), v.double(), mask)


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
        return scaled_dot_product_attention(
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
    assert_wrong_answer_fails(CHAPTER, sa, exercise, wrong, test_ids)


class _SelfAttentionWithScaleBuffer(sa.SelfAttention):
    """Correct, with an extra buffer the reference does not have."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__(d_model, d_k, d_v)
        self.register_buffer("scale", torch.tensor(1 / math.sqrt(d_k)))


def test_extra_buffers_in_a_correct_module_are_accepted():
    tests = load_chapter_tests(CHAPTER)
    namespace = {**vars(sa), "SelfAttention": _SelfAttentionWithScaleBuffer}
    assert verdicts(tests, namespace, 0)["self_attention_module"].passed


def test_wrongly_named_parameters_are_explained():
    tests = load_chapter_tests(CHAPTER)
    namespace = {**vars(sa), "SelfAttention": _SelfAttentionOwnNames}
    message = verdicts(tests, namespace, 0)["self_attention_module"].message
    assert "no parameters named W_q.weight" in message and "query.weight" in message


def test_float64_answer_is_accepted():
    """A correct answer computed in float64 is still correct: precision is not a mistake."""
    tests = load_chapter_tests(CHAPTER)
    results = verdicts(
        tests, {**vars(sa), "scaled_dot_product_attention": _sdpa_float64}, 0
    )
    assert all(v.passed for v in results.values())


def test_feedback_shows_no_hidden_inputs():
    """Messages describe differences; they never print tensors from the hidden cases."""
    tests = load_chapter_tests(CHAPTER)
    for mistake in tests.mistakes:
        namespace = {**vars(sa), mistake.exercise: mistake.impl}
        for v in verdicts(tests, namespace, 0).values():
            assert "tensor(" not in v.message and "[[" not in v.message


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


def _sdpa_minus_1e9_then_zero(q, k, v, mask=None):
    # The chapter says a fill of -1e9 is right for float32 when the masked weights are
    # zeroed after the softmax: it must pass every hidden test.
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights


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
    "scaled_dot_product_attention": [
        _sdpa_einsum_stable,
        _sdpa_inf_then_nan_to_num,
        _sdpa_minus_1e9_then_zero,
    ],
    "causal_mask": [_causal_by_comparison],
    "padding_mask": [_padding_by_expand],
    "SelfAttention": [_SelfAttentionInline],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, sa, exercise, right, seed)


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
    tests = load_chapter_tests(CHAPTER)
    selected = [t for t in tests.tests if t.exercise == "scaled_dot_product_attention"]
    namespace = {**vars(sa), "scaled_dot_product_attention": strange}
    for v in verdicts(tests, namespace, 0, selected).values():
        assert not v.passed and v.message

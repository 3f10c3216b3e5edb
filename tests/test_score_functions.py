"""Chapter 2, score functions: the references against PyTorch and the papers' formulas, and
the hidden tests against wrong and right answers written independently of the catalogue."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.grading.judging.spec import load_chapter_tests
from solutions import score_functions as sf
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    wrong_answers,
)

CHAPTER = "02_score_functions"


def _pairwise(query, keys, score):
    """score(q, k) applied to one (query, key) pair at a time: the formula, read literally."""
    return torch.stack(
        [
            torch.stack([score(query[b], keys[b, j]) for j in range(keys.size(1))])
            for b in range(query.size(0))
        ]
    )


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(0)


# ------------------------------------------------------------- references against formulas


def test_dot_scores_match_the_formula_and_torch(rng):
    query, keys = torch.randn(3, 8, generator=rng), torch.randn(3, 5, 8, generator=rng)
    scores = sf.dot_score(query, keys)
    torch.testing.assert_close(scores, _pairwise(query, keys, torch.dot))
    torch.testing.assert_close(scores, torch.bmm(keys, query[:, :, None])[..., 0])
    torch.testing.assert_close(
        sf.scaled_dot_score(query, keys),
        _pairwise(query, keys, lambda q, k: q @ k / math.sqrt(8)),
    )


def test_worked_example_of_the_chapter():
    query = torch.tensor([[1.0, 2.0]])
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    torch.testing.assert_close(
        torch.softmax(sf.dot_score(query, keys), -1),
        torch.tensor([[0.090, 0.245, 0.665]]),
        atol=5e-4,
        rtol=0,
    )
    torch.testing.assert_close(
        torch.softmax(sf.scaled_dot_score(query, keys), -1),
        torch.tensor([[0.140, 0.284, 0.576]]),
        atol=5e-4,
        rtol=0,
    )


def test_general_score_is_pytorchs_bilinear_form(rng):
    query, keys = torch.randn(3, 5, generator=rng), torch.randn(3, 4, 7, generator=rng)
    W = torch.randn(5, 7, generator=rng)
    scores = sf.general_score(query, keys, W)
    bilinear = nn.Bilinear(5, 7, 1, bias=False)
    with torch.no_grad():
        bilinear.weight.copy_(W[None])
        expected = bilinear(query[:, None, :].expand(3, 4, 5), keys)[..., 0]
    torch.testing.assert_close(scores, expected)
    torch.testing.assert_close(scores, _pairwise(query, keys, lambda q, k: q @ W @ k))
    q8, k8 = torch.randn(2, 8, generator=rng), torch.randn(2, 6, 8, generator=rng)
    torch.testing.assert_close(
        sf.general_score(q8, k8, torch.eye(8)), sf.dot_score(q8, k8)
    )


def test_projected_dot_score_is_a_low_rank_general_score(rng):
    """Chapter 3's q^T k of projections equals the general score with W = W^Q W^K^T."""
    W_Q, W_K = torch.randn(12, 4, generator=rng), torch.randn(12, 4, generator=rng)
    x_q, x_k = torch.randn(2, 12, generator=rng), torch.randn(2, 5, 12, generator=rng)
    torch.testing.assert_close(
        sf.dot_score(x_q @ W_Q, x_k @ W_K),
        sf.general_score(x_q, x_k, W_Q @ W_K.T),
        rtol=1e-4,
        atol=1e-5,
    )
    assert torch.linalg.matrix_rank(W_Q @ W_K.T) == 4


def test_additive_score_is_bahdanaus_network_and_luongs_concat(rng):
    d_q, d_k, d_a = 5, 7, 3
    query, keys = (
        torch.randn(2, d_q, generator=rng),
        torch.randn(2, 4, d_k, generator=rng),
    )
    W_q, W_k = (
        torch.randn(d_a, d_q, generator=rng),
        torch.randn(d_a, d_k, generator=rng),
    )
    v = torch.randn(d_a, generator=rng)
    scores = sf.additive_score(query, keys, W_q, W_k, v)
    torch.testing.assert_close(
        scores, _pairwise(query, keys, lambda q, k: v @ torch.tanh(W_q @ q + W_k @ k))
    )
    # Luong's concat: v_a^T tanh(W_a [h_t; h_s]) as PyTorch layers, W_a = [W_q W_k]
    hidden = nn.Linear(d_q + d_k, d_a, bias=False)
    out = nn.Linear(d_a, 1, bias=False)
    with torch.no_grad():
        hidden.weight.copy_(torch.cat([W_q, W_k], dim=1))
        out.weight.copy_(v[None])
        pairs = torch.cat([query[:, None].expand(2, 4, d_q), keys], dim=-1)
        expected = out(torch.tanh(hidden(pairs)))[..., 0]
    torch.testing.assert_close(scores, expected)


def test_additive_score_without_tanh_cannot_depend_on_the_query(rng):
    """The claim of the chapter: without tanh the query's term cancels in the softmax."""
    keys = torch.randn(1, 6, 4, generator=rng).expand(3, 6, 4)
    queries = torch.randn(3, 5, generator=rng)
    W_q, W_k = torch.randn(8, 5, generator=rng), torch.randn(8, 4, generator=rng)
    v = torch.randn(8, generator=rng)
    linear = (queries @ W_q.T)[:, None] @ v[:, None] + keys @ W_k.T @ v[:, None]
    weights = torch.softmax(linear[..., 0], -1)
    torch.testing.assert_close(weights, weights[:1].expand(3, 6))
    with_tanh = torch.softmax(sf.additive_score(queries, keys, W_q, W_k, v), -1)
    assert not torch.allclose(with_tanh, with_tanh[:1].expand(3, 6))


def test_location_score_is_a_linear_layer_over_positions(rng):
    query, W_a = torch.randn(3, 6, generator=rng), torch.randn(10, 6, generator=rng)
    layer = nn.Linear(6, 10, bias=False)
    with torch.no_grad():
        layer.weight.copy_(W_a)
        full = layer(query)  # W_a q for every position up to n_max
    for n in (1, 7, 10):
        torch.testing.assert_close(sf.location_score(query, W_a, n), full[:, :n])
    for bad_n in (11, 0, -1):  # beyond n_max, no position, a negative n
        with pytest.raises(ValueError):
            sf.location_score(query, W_a, bad_n)


def test_masked_softmax_matches_torch_and_zeroes_empty_rows(rng):
    scores = torch.randn(4, 7, generator=rng)
    mask = torch.rand(4, 7, generator=rng) < 0.5
    mask[:, 2] = True
    mask[3] = False  # a fully masked row
    weights = sf.masked_softmax(scores, mask)
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(weights[:3], expected[:3])
    assert torch.equal(weights[3], torch.zeros(7))
    assert bool((weights[~mask] == 0).all())
    torch.testing.assert_close(
        sf.masked_softmax(scores, None), torch.softmax(scores, -1)
    )
    huge = sf.masked_softmax(scores * 1e4, mask)
    assert torch.isfinite(huge).all()
    float64 = sf.masked_softmax(scores.double(), mask)
    assert float64.dtype == torch.float64 and torch.equal(float64[3], torch.zeros(7))


def test_masked_softmax_gradients_stay_finite_on_empty_rows():
    scores = torch.randn(2, 5, requires_grad=True)
    mask = torch.tensor([[True, False, True, True, False], [False] * 5])
    (sf.masked_softmax(scores, mask) * torch.randn(2, 5)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.equal(scores.grad[1], torch.zeros(5))


def test_attend_matches_torch_sdpa_with_and_without_mask(rng):
    query, keys = torch.randn(3, 8, generator=rng), torch.randn(3, 6, 8, generator=rng)
    values = torch.randn(3, 6, 5, generator=rng)
    mask = torch.rand(3, 6, generator=rng) < 0.5
    mask[:, 0] = True
    for m in (None, mask):
        context, weights = sf.attend(query, keys, values, mask=m)
        attn_mask = None if m is None else m[:, None]
        expected = F.scaled_dot_product_attention(
            query[:, None], keys, values, attn_mask=attn_mask
        )[:, 0]
        torch.testing.assert_close(context, expected)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3))


@pytest.mark.parametrize("name", ["dot", "general", "additive", "location"])
def test_attend_uses_the_score_it_is_given(rng, name):
    query, keys = torch.randn(3, 5, generator=rng), torch.randn(3, 4, 7, generator=rng)
    values = torch.randn(3, 4, 2, generator=rng)
    W, W_a = torch.randn(5, 7, generator=rng), torch.randn(9, 5, generator=rng)
    W_q, W_k = torch.randn(6, 5, generator=rng), torch.randn(6, 7, generator=rng)
    v = torch.randn(6, generator=rng)
    score_fn, per_pair = {
        "dot": (sf.dot_score, None),
        "general": (
            functools.partial(sf.general_score, W=W),
            lambda q, k: q @ W @ k,
        ),
        "additive": (
            functools.partial(sf.additive_score, W_q=W_q, W_k=W_k, v=v),
            lambda q, k: v @ torch.tanh(W_q @ q + W_k @ k),
        ),
        "location": (lambda q, k: sf.location_score(q, W_a, k.size(1)), None),
    }[name]
    if name == "dot":
        keys = keys[..., :5]
        scores = _pairwise(query, keys, torch.dot)
    elif name == "location":
        scores = query @ W_a[:4].T
    else:
        scores = _pairwise(query, keys, per_pair)
    mask = torch.tensor([[True, False, True, True], [True] * 4, [False] * 4])
    context, weights = sf.attend(query, keys, values, score_fn, mask)
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    expected = expected.nan_to_num(0.0)
    torch.testing.assert_close(weights, expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(
        context, torch.einsum("bn,bnv->bv", expected, values), rtol=1e-4, atol=1e-6
    )
    assert torch.equal(context[2], torch.zeros(2))


def test_variance_of_the_dot_product_grows_as_d_k():
    g = torch.Generator().manual_seed(0)
    for d_k in (4, 64, 512):
        q, k = (
            torch.randn(20000, d_k, generator=g),
            torch.randn(20000, d_k, generator=g),
        )
        raw = (q * k).sum(-1)
        assert abs(raw.var().item() / d_k - 1) < 0.05
        assert abs((raw / math.sqrt(d_k)).var().item() - 1) < 0.05


def test_hidden_tests_total_points():
    tests = load_chapter_tests(CHAPTER)
    assert 10 <= tests.max_score <= 20
    assert {t.exercise for t in tests.tests} == {
        "dot_score",
        "scaled_dot_score",
        "general_score",
        "additive_score",
        "location_score",
        "masked_softmax",
        "attend",
    }


# ------------------------------------ wrong answers written outside the mistake catalogue


def _dot_keepdim(query, keys):
    return keys @ query[:, :, None]  # (B, n, 1)


def _dot_negative_distance(query, keys):
    return -((keys - query[:, None]) ** 2).sum(-1)


def _scaled_by_batch_size(query, keys):
    return sf.dot_score(query, keys) / math.sqrt(query.size(0))


def _scaled_by_log(query, keys):
    return sf.dot_score(query, keys) / math.log(query.size(-1))


def _general_mean(query, keys, W):
    return ((query @ W)[:, None] * keys).mean(-1)


def _general_elementwise(query, keys, W):
    return (query @ W)[:, None] * keys  # forgot to sum: (B, n, d_k)


def _additive_relu(query, keys, W_q, W_k, v):
    return torch.relu((query @ W_q.T)[:, None] + keys @ W_k.T) @ v


def _additive_sigmoid(query, keys, W_q, W_k, v):
    return torch.sigmoid((query @ W_q.T)[:, None] + keys @ W_k.T) @ v


def _location_first_query_only(query, W_a, n):
    return (W_a[:n] @ query[0]).expand(query.size(0), n)


def _location_log_softmax(query, W_a, n):
    return torch.log_softmax(query @ W_a[:n].T, dim=-1)


def _masked_softmax_small_fill(scores, mask):
    if mask is None:
        return torch.softmax(scores, -1)
    return torch.softmax(scores.masked_fill(~mask, -1e4), -1)


def _masked_softmax_over_dim_1(scores, mask):
    filled = scores if mask is None else scores.masked_fill(~mask, -1e30)
    weights = torch.softmax(filled, dim=1)  # right for (B, n), wrong for (B, h, n)
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


def _masked_softmax_scores_times_mask(scores, mask):
    if mask is None:
        return torch.softmax(scores, -1)
    return torch.softmax(scores * mask, -1) * mask  # a masked score becomes 0, not -inf


def _attend_keepdim(query, keys, values, score_fn=None, mask=None):
    weights = sf.masked_softmax((score_fn or sf.scaled_dot_score)(query, keys), mask)
    return weights[:, None] @ values, weights  # context (B, 1, d_v)


def _attend_mean_not_weighted(query, keys, values, score_fn=None, mask=None):
    context, weights = sf.attend(query, keys, values, score_fn, mask)
    return values.mean(1), weights


def _attend_renormalised_after(query, keys, values, score_fn=None, mask=None):
    weights = torch.softmax((score_fn or sf.scaled_dot_score)(query, keys), -1)
    if mask is not None:
        weights = weights * mask
        weights = weights / weights.sum(-1, keepdim=True)  # 0/0 on an empty row
    return torch.einsum("bn,bnv->bv", weights, values), weights


def _attend_only_default_scores(query, keys, values, score_fn=None, mask=None):
    """Takes score_fn but always scores with q k^T / sqrt(d)."""
    scores = torch.einsum("bd,bnd->bn", query, keys) / query.size(-1) ** 0.5
    weights = sf.masked_softmax(scores, mask)
    return torch.einsum("bn,bnv->bv", weights, values), weights


def _attend_score_fn_on_values(query, keys, values, score_fn=None, mask=None):
    """Scores the query against the values instead of the keys (equal when d_v = d_k)."""
    weights = sf.masked_softmax((score_fn or sf.scaled_dot_score)(query, values), mask)
    return torch.einsum("bn,bnv->bv", weights, values), weights


INDEPENDENT_WRONG_ANSWERS = {
    "dot_score": {
        _dot_keepdim: ["sf_dot_score"],
        _dot_negative_distance: ["sf_dot_score"],
    },
    "scaled_dot_score": {
        _scaled_by_batch_size: ["sf_scaled_dot_score"],
        _scaled_by_log: ["sf_scaled_dot_score"],
    },
    "general_score": {
        _general_mean: ["sf_general_score"],
        _general_elementwise: ["sf_general_score"],
    },
    "additive_score": {
        _additive_relu: ["sf_additive_score"],
        _additive_sigmoid: ["sf_additive_score"],
    },
    "location_score": {
        _location_first_query_only: ["sf_location_score"],
        _location_log_softmax: ["sf_location_score"],
    },
    "masked_softmax": {
        _masked_softmax_small_fill: ["sf_masked_softmax_edge_cases"],
        _masked_softmax_over_dim_1: ["sf_masked_softmax_values"],
        _masked_softmax_scores_times_mask: [
            "sf_masked_softmax_values",
            "sf_masked_softmax_edge_cases",
        ],
    },
    "attend": {
        _attend_keepdim: ["sf_attend_basic", "sf_attend_masked"],
        _attend_mean_not_weighted: ["sf_attend_basic", "sf_attend_masked"],
        _attend_renormalised_after: ["sf_attend_masked"],
        _attend_only_default_scores: ["sf_attend_score_fn"],
        _attend_score_fn_on_values: [
            "sf_attend_basic",
            "sf_attend_masked",
            "sf_attend_score_fn",
        ],
    },
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails(CHAPTER, sf, exercise, wrong, test_ids)


# ------------------------------------ right answers in other styles must pass


def _dot_einsum(query, keys):
    return torch.einsum("bd,bnd->bn", query, keys)


def _dot_float64(query, keys):
    return (query.double()[:, None] * keys.double()).sum(-1)


def _scaled_rsqrt(query, keys):
    return (
        torch.einsum("bd,bnd->bn", query, keys)
        * torch.tensor(float(query.shape[-1])).rsqrt()
    )


def _general_keys_first(query, keys, W):
    return torch.einsum("bnk,qk,bq->bn", keys, W, query)


def _general_bilinear(query, keys, W):
    n = keys.size(1)
    return F.bilinear(query[:, None].expand(-1, n, -1), keys, W[None])[..., 0]


def _additive_concat(query, keys, W_q, W_k, v):
    n = keys.size(1)
    pairs = torch.cat([query[:, None].expand(-1, n, -1), keys], dim=-1)
    return torch.tanh(pairs @ torch.cat([W_q, W_k], 1).T) @ v


def _additive_einsum(query, keys, W_q, W_k, v):
    q_part = torch.einsum("aq,bq->ba", W_q, query)
    k_part = torch.einsum("ak,bnk->bna", W_k, keys)
    return torch.einsum("a,bna->bn", v, torch.tanh(q_part[:, None] + k_part))


def _in_range(W_a, n):
    """The docstring's contract, which an independent answer states first."""
    if not 1 <= n <= W_a.size(0):
        raise ValueError(f"n = {n} is outside 1 .. n_max = {W_a.size(0)}")


def _location_einsum(query, W_a, n):
    _in_range(W_a, n)
    return torch.einsum("jq,bq->bj", W_a[:n], query)


def _location_linear(query, W_a, n):
    _in_range(W_a, n)
    return F.linear(query, W_a)[:, :n]


def _masked_softmax_nan_to_num(scores, mask):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0)


def _masked_softmax_by_hand(scores, mask):
    allowed = (
        torch.ones_like(scores, dtype=torch.bool)
        if mask is None
        else mask.expand_as(scores)
    )
    filled = scores.masked_fill(~allowed, -math.inf)
    top = filled.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = torch.exp(filled - top)  # exactly 0 where masked
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp_min(1e-30), torch.zeros_like(e))


def _attend_einsum(query, keys, values, score_fn=None, mask=None):
    scores = (score_fn or sf.scaled_dot_score)(query, keys)
    weights = sf.masked_softmax(scores, mask)
    return torch.einsum("bn,bnv->bv", weights, values), weights


def _attend_float64(query, keys, values, score_fn=None, mask=None):
    """The given score function on the given inputs; softmax and average in float64."""
    scores = (score_fn or sf.scaled_dot_score)(query, keys).double()  # (B, n)
    weights = sf.masked_softmax(scores, mask)
    return (weights.unsqueeze(1) @ values.double()).squeeze(1), weights


INDEPENDENT_CORRECT_ANSWERS = {
    "dot_score": [_dot_einsum, _dot_float64],
    "scaled_dot_score": [_scaled_rsqrt],
    "general_score": [_general_keys_first, _general_bilinear],
    "additive_score": [_additive_concat, _additive_einsum],
    "location_score": [_location_einsum, _location_linear],
    "masked_softmax": [_masked_softmax_nan_to_num, _masked_softmax_by_hand],
    "attend": [_attend_einsum, _attend_float64],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, sf, exercise, right, seed)

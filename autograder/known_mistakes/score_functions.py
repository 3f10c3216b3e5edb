"""Known mistakes of score functions: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import math

import torch

from autograder.grading.judging.spec import Mistake
from solutions import score_functions as ref


def _dot_scaled(query, keys):
    return ref.dot_score(query, keys) / math.sqrt(query.size(-1))


def _dot_softmaxed(query, keys):
    return torch.softmax(ref.dot_score(query, keys), dim=-1)


def _dot_cosine(query, keys):
    return torch.cosine_similarity(query.unsqueeze(1), keys, dim=-1)


def _dot_no_unsqueeze(query, keys):
    # (B, n, d) * (B, d) broadcasts as (B, n, d) * (1, B, d) when B == n: key j of every
    # row meets query j instead of its own row's query
    return (keys * query).sum(-1)


def _scaled(divisor):
    def score(query, keys):
        return ref.dot_score(query, keys) / divisor(query, keys)

    return score


def _scaled_times_sqrt(query, keys):
    return ref.dot_score(query, keys) * math.sqrt(query.size(-1))


def _general_transposed(query, keys, W):
    return ref.dot_score(query @ W.T, keys)


def _general_ignores_W(query, keys, W):
    return ref.dot_score(query, keys)


def _general_scaled(query, keys, W):
    return ref.general_score(query, keys, W) / math.sqrt(keys.size(-1))


def _general_softmaxed(query, keys, W):
    return torch.softmax(ref.general_score(query, keys, W), dim=-1)


def _additive(*, act=torch.tanh, swap=False, transpose=False, v_mode="dot"):
    """additive_score with one slip: the activation, W_q and W_k swapped, matrices used
    transposed, or v used wrongly ("ignored": a plain sum; "inside": tanh after v;
    "separate": tanh applied to the query and key parts separately)."""

    def score(query, keys, W_q, W_k, v):
        if swap:
            W_q, W_k = W_k, W_q
        if transpose:
            W_q, W_k = W_q.T, W_k.T
        q_part = (query @ W_q.T).unsqueeze(1)  # (B, 1, d_a)
        k_part = keys @ W_k.T  # (B, n, d_a)
        if v_mode == "ignored":
            return act(q_part + k_part).sum(-1)
        if v_mode == "inside":
            return torch.tanh((q_part + k_part) @ v)
        if v_mode == "separate":
            return (act(q_part) + act(k_part)) @ v
        return act(q_part + k_part) @ v

    return score


def _location_softmaxed(query, W_a, n):
    return torch.softmax(ref.location_score(query, W_a, n), dim=-1)


def _location_transposed(query, W_a, n):
    return (query @ W_a)[:, :n]


def _location_last_rows(query, W_a, n):
    return query @ W_a[W_a.size(0) - n :].T


def _location_all_rows(query, W_a, n):
    return query @ W_a.T


def _masked_softmax(
    *, fill=None, invert=False, dim=-1, after=False, zero_fill=False, naive=False
):
    """masked_softmax with one slip. ``fill``: the value put in masked scores by a version
    that does not zero the masked weights afterwards; ``after``: the mask multiplies the
    weights without renormalising; ``zero_fill``: masked scores set to 0; ``naive``: exp
    without subtracting the maximum."""

    def masked(scores, mask):
        if mask is not None and invert:
            mask = ~mask
        if naive:
            e = torch.exp(scores)
            if mask is not None:
                e = e * mask
            return e / e.sum(dim, keepdim=True)
        if mask is None:
            return torch.softmax(scores, dim=dim)
        if after:
            return torch.softmax(scores, dim=dim) * mask
        if zero_fill:
            return torch.softmax(scores.masked_fill(~mask, 0.0), dim=dim)
        value = torch.finfo(scores.dtype).min if fill is None else fill
        weights = torch.softmax(scores.masked_fill(~mask, value), dim=dim)
        return weights if fill is not None else weights.masked_fill(~mask, 0.0)

    return masked


def _attend(
    *,
    forced_score=None,
    softmax_dim=-1,
    mask_weights=True,
    mask_context=True,
    from_keys=False,
    swap_outputs=False,
    invert_mask=False,
    sum_context=True,
):
    """attend with one slip: which weights the context and the result use, the softmax
    axis, values replaced by keys, outputs swapped, the mask inverted, no sum over keys."""

    def attend(query, keys, values, score_fn=None, mask=None):
        scores = (forced_score or score_fn or ref.scaled_dot_score)(query, keys)
        if mask is not None and invert_mask:
            mask = ~mask
        unmasked = torch.softmax(scores, dim=softmax_dim)
        masked = (
            unmasked if mask is None else _masked_softmax(dim=softmax_dim)(scores, mask)
        )
        weights = masked if mask_weights else unmasked
        used = masked if mask_context else unmasked
        source = keys if from_keys else values
        if sum_context:
            context = (used.unsqueeze(1) @ source).squeeze(1)
        else:
            context = used.unsqueeze(-1) * source
        return (weights, context) if swap_outputs else (context, weights)

    return attend


MISTAKES = [
    Mistake(
        "dot_score",
        "scaled",
        "your scores look divided by sqrt(d): the plain dot score is q^T k, unscaled (that is scaled_dot_score).",
        _dot_scaled,
    ),
    Mistake(
        "dot_score",
        "softmax applied",
        "your scores look like weights (rows sum to 1): return the raw scores q^T k; attend takes the softmax.",
        _dot_softmaxed,
    ),
    Mistake(
        "dot_score",
        "cosine similarity",
        "your scores look normalised by the vector lengths (cosine similarity): the dot score is q^T k without dividing by |q| |k|.",
        _dot_cosine,
    ),
    Mistake(
        "dot_score",
        "query not broadcast over keys",
        "your row b seems to use the queries of other rows: add a key axis to the query (query.unsqueeze(1) or einsum 'bd,bnd->bn') so each row's query meets its own keys.",
        _dot_no_unsqueeze,
    ),
    Mistake(
        "scaled_dot_score",
        "unscaled",
        "your scores look unscaled: divide q^T k by sqrt(d), d = query.size(-1).",
        _scaled(lambda q, k: 1.0),
    ),
    Mistake(
        "scaled_dot_score",
        "divided by d",
        "your scores look divided by d: the scale is 1/sqrt(d), not 1/d.",
        _scaled(lambda q, k: q.size(-1)),
    ),
    Mistake(
        "scaled_dot_score",
        "divided by sqrt(n)",
        "your scores look divided by the square root of the number of keys: divide by sqrt(d), the vector size (the last dimension).",
        _scaled(lambda q, k: math.sqrt(k.size(1))),
    ),
    Mistake(
        "scaled_dot_score",
        "multiplied by sqrt(d)",
        "your scores look multiplied by sqrt(d): divide by it instead.",
        _scaled_times_sqrt,
    ),
    Mistake(
        "general_score",
        "W transposed",
        "your scores look like q^T W^T k: with W of shape (d_q, d_k), compute q^T W (shape d_k) and dot it with each key.",
        _general_transposed,
    ),
    Mistake(
        "general_score",
        "W ignored",
        "your scores equal the plain dot score: multiply by W in between, q^T W k.",
        _general_ignores_W,
    ),
    Mistake(
        "general_score",
        "scaled",
        "your scores look divided by sqrt(d_k): the general score has no scale factor.",
        _general_scaled,
    ),
    Mistake(
        "general_score",
        "softmax applied",
        "your scores look like weights (rows sum to 1): return the raw scores q^T W k.",
        _general_softmaxed,
    ),
    Mistake(
        "additive_score",
        "tanh missing",
        "your scores look linear in q and k: apply tanh to W_q q + W_k k before multiplying by v.",
        _additive(act=lambda x: x),
    ),
    Mistake(
        "additive_score",
        "v ignored",
        "your scores look like a plain sum over the d_a hidden units: weight them with v (multiply by v, then sum).",
        _additive(v_mode="ignored"),
    ),
    Mistake(
        "additive_score",
        "tanh after v",
        "your scores look like tanh(v^T (W_q q + W_k k)): apply tanh first, then v, v^T tanh(...).",
        _additive(v_mode="inside"),
    ),
    Mistake(
        "additive_score",
        "tanh applied separately",
        "your scores look like v^T (tanh(W_q q) + tanh(W_k k)): add the two projections first, then apply one tanh to the sum.",
        _additive(v_mode="separate"),
    ),
    Mistake(
        "additive_score",
        "W_q and W_k swapped",
        "W_q and W_k look swapped: W_q (d_a, d_q) multiplies the query, W_k (d_a, d_k) the keys.",
        _additive(swap=True),
    ),
    Mistake(
        "additive_score",
        "matrices transposed",
        "your matrices look transposed: W_q has shape (d_a, d_q), so W_q q is query @ W_q.T for a batch of row vectors.",
        _additive(transpose=True),
    ),
    Mistake(
        "location_score",
        "softmax applied",
        "your scores look like weights (rows sum to 1): return the logits W_a q; attend takes the softmax.",
        _location_softmaxed,
    ),
    Mistake(
        "location_score",
        "W_a transposed",
        "your W_a looks transposed: it has shape (n_max, d_q), one row per source position, so the scores are query @ W_a[:n].T.",
        _location_transposed,
    ),
    Mistake(
        "location_score",
        "last n rows",
        "your scores use the last n rows of W_a: row j belongs to source position j, so take the first n rows, W_a[:n].",
        _location_last_rows,
    ),
    Mistake(
        "location_score",
        "n ignored",
        "you return a score for all n_max positions: keep only the first n (the length of this source).",
        _location_all_rows,
    ),
    Mistake(
        "masked_softmax",
        "-inf fill",
        "fully masked rows come out as NaN: after filling with -inf, a row with no allowed entry is 0/0; give such rows zero weights.",
        _masked_softmax(fill=float("-inf")),
    ),
    Mistake(
        "masked_softmax",
        "-1e9 fill",
        "fully masked rows get uniform weights instead of zeros: with a finite fill such as -1e9 their softmax is uniform; zero the masked weights afterwards.",
        _masked_softmax(fill=-1e9),
    ),
    Mistake(
        "masked_softmax",
        "inverted mask",
        "your mask looks inverted: True means the position MAY be attended to; hide the positions where the mask is False.",
        _masked_softmax(invert=True),
    ),
    Mistake(
        "masked_softmax",
        "softmax over the wrong axis",
        "your weights look normalised along another dimension: take the softmax over the last dimension, so each row sums to 1.",
        _masked_softmax(dim=-2),
    ),
    Mistake(
        "masked_softmax",
        "mask applied after the softmax",
        "your allowed weights do not sum to 1: mask the scores before the softmax (or renormalise), not only the weights after it.",
        _masked_softmax(after=True),
    ),
    Mistake(
        "masked_softmax",
        "masked scores set to 0",
        "masked entries still get weight: setting their scores to 0 is not enough (exp(0) = 1); use a very negative fill and zero them.",
        _masked_softmax(zero_fill=True),
    ),
    Mistake(
        "masked_softmax",
        "exp without subtracting the max",
        "huge scores overflow: exp(1000) is inf in float32; subtract the row maximum before exponentiating, or use torch.softmax.",
        _masked_softmax(naive=True),
    ),
    Mistake(
        "attend",
        "weights before masking",
        "the weights you return ignore the mask although the context uses it: return the masked weights.",
        _attend(mask_weights=False),
    ),
    Mistake(
        "attend",
        "mask ignored",
        "masked keys still get weight: pass the mask to masked_softmax.",
        _attend(mask_weights=False, mask_context=False),
    ),
    Mistake(
        "attend",
        "inverted mask",
        "your mask looks inverted: True means the key MAY be attended to.",
        _attend(invert_mask=True),
    ),
    Mistake(
        "attend",
        "softmax over the batch",
        "your weights look normalised over the batch: take the softmax over the keys (the last dimension).",
        _attend(softmax_dim=0),
    ),
    Mistake(
        "attend",
        "context from keys",
        "your context looks like a weighted sum of the keys: average the values.",
        _attend(from_keys=True),
    ),
    Mistake(
        "attend",
        "outputs swapped",
        "your outputs look swapped: return (context, weights), in that order.",
        _attend(swap_outputs=True),
    ),
    Mistake(
        "attend",
        "unscaled default",
        "with score_fn=None your scores look unscaled: the default is scaled_dot_score.",
        _attend(forced_score=ref.dot_score),
    ),
    Mistake(
        "attend",
        "score_fn ignored",
        "your attend scores with scaled dot products whatever score_fn it is given: call score_fn(query, keys) when it is not None.",
        _attend(forced_score=ref.scaled_dot_score),
    ),
    Mistake(
        "attend",
        "context not summed",
        "your context keeps the key axis: sum the weighted values over the n keys, giving (B, d_v).",
        _attend(sum_context=False),
    ),
]

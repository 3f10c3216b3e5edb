"""Chapter 2, the score-function zoo: reference implementations.

Shapes are batch first: one query per batch row, ``query (B, d_q)``, against that row's
``n`` keys, ``keys (B, n, d_k)``; every score function returns ``scores (B, n)``. Weight
matrices are stored as in the papers' formulas (``W_q q`` means ``W_q`` has shape
``(d_a, d_q)``), so a row vector ``q`` of a batch is multiplied by ``W_q.T``.
"""

import math

import torch


def dot_score(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """score(q, k_j) = q^T k_j (Luong's "dot"): (B, d), (B, n, d) -> (B, n)."""
    # (B, n, d) @ (B, d, 1) -> (B, n, 1): one dot product per key, for every batch row
    return (keys @ query.unsqueeze(-1)).squeeze(-1)


def scaled_dot_score(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """score(q, k_j) = q^T k_j / sqrt(d) (Vaswani et al.): (B, d), (B, n, d) -> (B, n)."""
    d = query.size(-1)
    # the standard deviation of q^T k grows as sqrt(d): dividing by it keeps scores O(1)
    return dot_score(query, keys) / math.sqrt(d)


def general_score(
    query: torch.Tensor, keys: torch.Tensor, W: torch.Tensor
) -> torch.Tensor:
    """score(q, k_j) = q^T W k_j (Luong's "general"), W of shape (d_q, d_k)."""
    projected = query @ W  # (B, d_k): q^T W, computed once and shared by all n keys
    return dot_score(projected, keys)  # (B, n)


def additive_score(
    query: torch.Tensor,
    keys: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    """score(q, k_j) = v^T tanh(W_q q + W_k k_j) (Bahdanau), W_q (d_a, d_q), W_k (d_a, d_k), v (d_a,)."""
    q_part = query @ W_q.T  # (B, d_a): W_q q, once per query
    # (B, n, d_a): W_k k_j, independent of the query (Bahdanau et al. precompute it)
    k_part = keys @ W_k.T
    hidden = torch.tanh(q_part.unsqueeze(1) + k_part)  # (B, n, d_a), q broadcast
    return hidden @ v  # (B, n): v^T tanh(...) for every key


def location_score(query: torch.Tensor, W_a: torch.Tensor, n: int) -> torch.Tensor:
    """Luong's location-based scores W_a q, restricted to the first n source positions.

    W_a has shape (n_max, d_q): row j holds the weights of source position j. The scores
    (B, n) are the logits of Luong's a_t = softmax(W_a h_t); the keys are never looked at.
    """
    n_max = W_a.size(0)
    if not 1 <= n <= n_max:
        raise ValueError(
            f"n must be between 1 and n_max = {n_max} (the rows of W_a), got n = {n}"
        )
    return query @ W_a[:n].T  # (B, d_q) @ (d_q, n) -> (B, n)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dimension that gives masked positions (mask False) weight 0."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    # The most negative finite float, not -inf: a fully masked row then gives a uniform
    # softmax (no NaN, no NaN gradients) that the masked_fill below turns into zeros.
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(filled, dim=-1)
    return weights.masked_fill(~mask, 0.0)


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    score_fn=None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score, normalise, average: context (B, d_v) and weights (B, n)."""
    if score_fn is None:
        score_fn = scaled_dot_score
    scores = score_fn(query, keys)  # (B, n)
    weights = masked_softmax(scores, mask)  # (B, n), masked keys get exactly 0
    # (B, 1, n) @ (B, n, d_v) -> (B, 1, d_v): the weighted sum of the values
    context = (weights.unsqueeze(1) @ values).squeeze(1)  # (B, d_v)
    return context, weights

"""Chapter 3, self-attention: reference implementations."""

import math

import torch
from torch import nn


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d_k)) v with a boolean mask (True = may attend)."""
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., n_q, n_k)
    if mask is not None:
        # The most negative finite float, not -inf: a fully masked row then gives a
        # uniform softmax (no NaN, finite gradients) that the next line zeroes.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., n_q, n_k), rows sum to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights  # (..., n_q, d_v), (..., n_q, n_k)


def causal_mask(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(n, n) bool: query i may attend to key j exactly when j <= i."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: torch.Tensor, n: int) -> torch.Tensor:
    """(B, 1, n) bool: key j of sequence b is real (True) when j < lengths[b]."""
    positions = torch.arange(n, device=lengths.device)  # (n,)
    return (positions < lengths[:, None]).unsqueeze(1)  # (B, 1, n)


class SelfAttention(nn.Module):
    """Single-head self-attention: Q, K and V are projections of the same x."""

    def __init__(self, d_model: int, d_k: int, d_v: int):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_v, bias=False)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = (
            self.W_q(x),
            self.W_k(x),
            self.W_v(x),
        )  # (B, n, d_k), (B, n, d_k), (B, n, d_v)
        return scaled_dot_product_attention(q, k, v, mask)

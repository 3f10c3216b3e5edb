"""Chapter 5, positional encoding: reference implementations."""

import torch
from torch import nn


def sinusoidal_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, d_model): PE[pos, 2i] = sin(pos w_i), PE[pos, 2i+1] = cos(pos w_i).

    Returns float32; an odd d_model raises ValueError."""
    if d_model % 2 != 0:
        raise ValueError(
            f"d_model must be even (a sine and a cosine per pair), got {d_model}"
        )
    # Angles in float64: in float32, pos * w_i near pos = 1000 is off by about 1e-4 rad.
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(
        0, d_model, 2, dtype=torch.float64
    )  # (d_model/2,): 0, 2, 4, ...
    omega = 10000.0 ** (-two_i / d_model)  # (d_model/2,): 1 down to about 1/10000
    angle = position * omega  # (max_len, d_model/2)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)  # even dimensions 2i
    pe[:, 1::2] = torch.cos(angle)  # odd dimensions 2i+1
    return pe.float()


def shift_matrix(k: int, d_model: int) -> torch.Tensor:
    """(d_model, d_model) block-diagonal rotation M(k) with PE[pos + k] = M(k) @ PE[pos].

    Returns float32; an odd d_model raises ValueError."""
    if d_model % 2 != 0:
        raise ValueError(
            f"d_model must be even (a sine and a cosine per pair), got {d_model}"
        )
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    angle = k * 10000.0 ** (-two_i / d_model)  # (d_model/2,): w_i k
    cos, sin = torch.cos(angle), torch.sin(angle)
    even = torch.arange(0, d_model, 2)  # row/column of sin(w_i pos) in PE[pos]
    odd = even + 1  # row/column of cos(w_i pos)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    # sin(a + b) = sin a cos b + cos a sin b;  cos(a + b) = cos a cos b - sin a sin b
    m[even, even], m[even, odd] = cos, sin
    m[odd, even], m[odd, odd] = -sin, cos
    return m.float()


class LearnedPositionalEmbedding(nn.Module):
    """A trainable vector per position 0 .. max_len-1, added to the token vectors."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)  # weight: (max_len, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.size(-2)
        if n > self.max_len:
            raise ValueError(
                f"sequence length {n} exceeds max_len = {self.max_len}: "
                "a learned table has no vector for those positions"
            )
        positions = torch.arange(n, device=x.device)  # (n,): 0, 1, ..., n-1
        return x + self.embedding(positions)  # (..., n, d_model) + (n, d_model)


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0
) -> torch.Tensor:
    """Rotate each adjacent pair (x[2i], x[2i+1]) at position m by the angle m * theta_i,
    theta_i = theta^(-2i / d).

    Returns x's dtype; an odd last dimension raises ValueError."""
    d = x.size(-1)
    if d % 2 != 0:
        raise ValueError(f"the last dimension d of x must be even (pairs), got {d}")
    two_i = torch.arange(0, d, 2, dtype=torch.float64, device=x.device)  # (d/2,)
    theta_i = theta ** (-two_i / d)  # (d/2,)
    angle = positions.to(x.device, torch.float64)[:, None] * theta_i  # (n, d/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., n, d/2) each
    # the 2-D rotation (x_even, x_odd) -> R(m theta_i) (x_even, x_odd), counterclockwise
    rotated_even = x_even * cos - x_odd * sin
    rotated_odd = x_even * sin + x_odd * cos
    # interleave back: (..., n, d/2, 2) -> (..., n, d)
    return torch.stack([rotated_even, rotated_odd], dim=-1).flatten(-2)

"""Chapter 7, relative position representations (Shaw et al., 2018): reference implementations."""

import math

import torch
from torch import nn


def relative_position_index(
    n: int, max_distance: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """(n, n) long: index[i, j] = clip(j - i, -max_distance, max_distance) + max_distance."""
    positions = torch.arange(n, device=device)  # (n,)
    offsets = positions[None, :] - positions[:, None]  # (n, n), offsets[i, j] = j - i
    # Clip to [-k, k], then shift by k so that the offset is a row of a (2k + 1)-row table.
    return offsets.clamp(-max_distance, max_distance) + max_distance


class RelativePositionEmbedding(nn.Module):
    """A table of 2k + 1 learned vectors w_{-k}, ..., w_k, looked up as a_ij = w_clip(j - i, k)."""

    def __init__(self, max_distance: int, d: int):
        super().__init__()
        self.max_distance = max_distance
        self.embeddings = nn.Embedding(2 * max_distance + 1, d)  # row r holds w_{r - k}

    def forward(self, n: int) -> torch.Tensor:
        rows = relative_position_index(
            n, self.max_distance, self.embeddings.weight.device
        )
        return self.embeddings(rows)  # (n, n, d): entry [i, j] is table row rows[i, j]


def relative_attention_logits(
    q: torch.Tensor, k: torch.Tensor, a_k: torch.Tensor
) -> torch.Tensor:
    """e_ij = q_i . (k_j + a_ij) / sqrt(d), without a (B, h, n, n, d) tensor."""
    n, d = q.shape[-2], q.shape[-1]
    content = q @ k.transpose(-2, -1)  # (..., n, n): q_i . k_j
    # q_i . a_ij: a_ij depends on the pair, so it cannot be one matrix product per head.
    # Put the query position first instead: for each i, one product of the queries of all
    # heads and sequences at position i, (B*h, d), with the transposed row a_i, (d, n).
    q_by_position = q.movedim(-2, 0).reshape(n, -1, d)  # (n, B*h, d)
    relative = q_by_position @ a_k.transpose(-2, -1)  # (n, B*h, n)
    relative = relative.reshape(n, *q.shape[:-2], n).movedim(0, -2)  # (..., n, n)
    return (content + relative) / math.sqrt(d)


def relative_attention_output(
    weights: torch.Tensor, v: torch.Tensor, a_v: torch.Tensor
) -> torch.Tensor:
    """z_i = sum_j weights_ij (v_j + a_ij), without a (B, h, n, n, d) tensor."""
    n = weights.shape[-2]
    content = weights @ v  # (..., n, d): sum_j weights_ij v_j
    # The same reshaping as for the logits: for each query position i, one product of
    # the weights of all heads and sequences, (B*h, n), with the rows a_ij, (n, d).
    weights_by_position = weights.movedim(-2, 0).reshape(n, -1, n)  # (n, B*h, n)
    relative = weights_by_position @ a_v  # (n, B*h, d)
    # Back to (..., n, d): split B*h again and move the query axis into place.
    relative = relative.reshape(n, *weights.shape[:-2], -1).movedim(0, -2)
    return content + relative


class RelativeMultiHeadAttention(nn.Module):
    """Multi-head self-attention with relative position representations shared by all heads."""

    def __init__(self, d_model: int, num_heads: int, max_distance: int):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}"
            )
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        # One table each for a^K and a^V, of head width d_k, used by every head.
        self.rel_k = RelativePositionEmbedding(max_distance, self.d_k)
        self.rel_v = RelativePositionEmbedding(max_distance, self.d_k)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, n, d_model = x.shape

        def split_heads(t: torch.Tensor) -> torch.Tensor:
            """(B, n, d_model) -> (B, h, n, d_k): head m takes columns m*d_k ... (m+1)*d_k - 1."""
            return t.view(batch, n, self.num_heads, self.d_k).transpose(1, 2)

        q = split_heads(self.W_q(x))  # (B, h, n, d_k)
        k = split_heads(self.W_k(x))
        v = split_heads(self.W_v(x))
        scores = relative_attention_logits(q, k, self.rel_k(n))  # (B, h, n, n)
        if mask is not None:
            mask = mask.unsqueeze(-3)  # (..., 1, n, n): the same mask for every head
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)  # (B, h, n, n)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)  # fully masked rows become zeros
        z = relative_attention_output(weights, v, self.rel_v(n))  # (B, h, n, d_k)
        out = self.W_o(z.transpose(1, 2).reshape(batch, n, d_model))  # (B, n, d_model)
        return out, weights


def alibi_bias(
    n: int, num_heads: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """(num_heads, n, n) float: bias[h - 1, i, j] = -m_h |i - j| with m_h = 2^(-8 h / H)."""
    heads = torch.arange(1, num_heads + 1, device=device)  # (H,): 1, ..., H
    # (H,): a geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^-8, steepest first
    slopes = 2.0 ** (-8.0 * heads / num_heads)
    positions = torch.arange(n, device=device)  # (n,)
    distance = (positions[None, :] - positions[:, None]).abs()  # (n, n), |j - i|
    return -slopes[:, None, None] * distance  # (H, n, n)

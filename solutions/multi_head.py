"""Chapter 4, multi-head attention: reference implementations."""

import math

import torch
from torch import nn


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d_k)) v over the last two dimensions; mask True = may attend."""
    d_k = q.size(-1)  # the width of one head's queries and keys
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., n_q, n_k)
    if mask is not None:
        # The most negative finite float, not -inf: a fully masked row then gives a
        # uniform softmax (no NaN) that the zeroing below turns into zeros.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., n_q, n_k), rows sum to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights  # (..., n_q, d_v), (..., n_q, n_k)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, n, d_model) -> (B, h, n, d_model / h); head i gets features [i d_head, (i+1) d_head)."""
    batch, n, d_model = x.shape
    if d_model % num_heads != 0:
        raise ValueError(f"d_model = {d_model} is not divisible by {num_heads} heads")
    d_head = d_model // num_heads
    # Cut each token's feature vector into h consecutive blocks, then move the head
    # dimension in front of the tokens so that every head is a batch of sequences.
    x = x.reshape(batch, n, num_heads, d_head)  # (B, n, h, d_head)
    return x.transpose(1, 2)  # (B, h, n, d_head)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, n, d_head) -> (B, n, h d_head): the inverse of split_heads."""
    batch, num_heads, n, d_head = x.shape
    # Tokens back in front of the heads, then concatenate the heads' features per token.
    # reshape, not view: after the transpose the memory is no longer contiguous.
    x = x.transpose(1, 2)  # (B, n, h, d_head)
    return x.reshape(batch, n, num_heads * d_head)  # (B, n, d_model)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: h scaled dot-product attentions on slices of one projection."""

    def __init__(self, d_model: int, num_heads: int, bias: bool = True):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model = {d_model} is not divisible by num_heads = {num_heads}"
            )
        self.num_heads = num_heads
        # One full-width projection each; split_heads later cuts them into h heads.
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q = split_heads(self.W_q(query), self.num_heads)  # (B, h, n_q, d_head)
        k = split_heads(self.W_k(key), self.num_heads)  # (B, h, n_k, d_head)
        v = split_heads(self.W_v(value), self.num_heads)  # (B, h, n_k, d_head)
        if mask is not None and mask.dim() == 3:
            # (B, n_q, n_k) or (B, 1, n_k): insert the head dimension, so that every
            # head of sequence b uses mask[b] (without it, mask[b] would meet head b).
            mask = mask.unsqueeze(1)  # (B, 1, n_q or 1, n_k)
        out, weights = attention(q, k, v, mask)  # (B, h, n_q, d_head), (B, h, n_q, n_k)
        return self.W_o(
            merge_heads(out)
        ), weights  # (B, n_q, d_model), per-head weights

    def load_torch_weights(self, mha: nn.Module) -> None:
        d_model = self.W_q.in_features
        if mha.embed_dim != d_model or mha.num_heads != self.num_heads:
            raise ValueError(
                f"expected a layer with embed_dim {d_model} and {self.num_heads} heads, "
                f"got {mha.embed_dim} and {mha.num_heads}"
            )
        if mha.in_proj_weight is None or mha.bias_k is not None:
            raise ValueError(
                "only the standard layout is supported (no kdim, vdim, add_bias_kv)"
            )
        if (mha.in_proj_bias is None) != (self.W_q.bias is None):
            raise ValueError("one layer has biases and the other has not")
        # PyTorch stacks W_q, W_k, W_v (each in nn.Linear's (out, in) layout) in one
        # matrix, and their biases in one vector; load_state_dict copies them as they are.
        weights = mha.in_proj_weight.chunk(3)  # 3 x (d_model, d_model)
        biases = [None] * 3 if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
        for linear, weight, b in zip(
            (self.W_q, self.W_k, self.W_v), weights, biases, strict=True
        ):
            state = {"weight": weight} if b is None else {"weight": weight, "bias": b}
            linear.load_state_dict(state)
        self.W_o.load_state_dict(mha.out_proj.state_dict())

"""Scaled dot-product attention with one deliberate slip: the known mistakes of chapter 3's
``scaled_dot_product_attention`` and chapter 4's ``attention`` (the same computation)."""

import math

import torch


def wrong_attention(
    *, scale="sqrt", softmax_dim=-1, invert_mask=False, transpose=False, fill=None
):
    """Attention with one deliberate slip. ``fill``: the value put in
    masked scores by a version that does not zero fully masked rows afterwards."""

    def attention(q, k, v, mask=None):
        d_k = q.size(-1)
        scores = q @ k.transpose(-2, -1)
        if transpose:
            scores = scores.transpose(-2, -1)
        scores = scores / {"sqrt": math.sqrt(d_k), "none": 1.0, "d_k": d_k}[scale]
        if mask is not None:
            mask = ~mask if invert_mask else mask
            value = torch.finfo(scores.dtype).min if fill is None else fill
            scores = scores.masked_fill(~mask, value)
        weights = torch.softmax(scores, dim=softmax_dim)
        if mask is not None and fill is None:
            weights = weights.masked_fill(~mask, 0.0)
        return weights @ v, weights

    return attention

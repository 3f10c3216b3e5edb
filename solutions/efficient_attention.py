"""Chapter 8, efficient attention: reference implementations.

The attention functions take queries, keys and values with leading batch dimensions,
``(..., n, d)``, and return only the output ``(..., n_q, d_v)``, not the weights: the point
of the chapter is to avoid forming the ``(n_q, n_k)`` weight matrix.
"""

import math

import torch
import torch.nn.functional as F


def chunked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """Exact softmax attention, computed for ``chunk_size`` queries at a time."""
    scale = 1.0 / math.sqrt(q.size(-1))
    out = q.new_empty((*q.shape[:-1], v.size(-1)))  # (..., n_q, d_v)
    for start in range(0, q.size(-2), chunk_size):
        rows = slice(start, start + chunk_size)  # the last chunk may be shorter
        scores = q[..., rows, :] @ k.transpose(-2, -1) * scale  # (..., c, n_k)
        # each query's softmax needs only its own row of scores: rows are independent
        out[..., rows, :] = torch.softmax(scores, dim=-1) @ v  # (..., c, d_v)
    return out


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int = 64,
    causal: bool = False,
) -> torch.Tensor:
    """Exact softmax attention, one block of keys at a time, with an online softmax."""
    n_q, n_k = q.size(-2), k.size(-2)
    q = q / math.sqrt(q.size(-1))  # scale once, not once per block
    # per query row: the running max m, the running denominator and the running
    # unnormalised output, all relative to the largest score seen so far
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))  # (..., n_q, 1)
    denom = q.new_zeros((*q.shape[:-1], 1))  # (..., n_q, 1)
    acc = q.new_zeros((*q.shape[:-1], v.size(-1)))  # (..., n_q, d_v)
    # causal: key j is visible to queries i >= j only, so keys j >= n_q are visible to none
    n_keys = min(n_k, n_q) if causal else n_k
    for start in range(0, n_keys, block_size):
        end = min(start + block_size, n_keys)
        # causal: the query blocks above this key block see none of it; skip their rows
        rows = slice(start if causal else 0, n_q)
        s = q[..., rows, :] @ k[..., start:end, :].transpose(-2, -1)  # (..., r, b)
        if causal:
            i = torch.arange(start, n_q, device=q.device)[:, None]
            j = torch.arange(start, end, device=q.device)[None, :]
            s = s.masked_fill(j > i, float("-inf"))  # the diagonal itself stays visible
        m_old = m[..., rows, :]
        m_new = torch.maximum(m_old, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)  # (..., r, b), every entry <= 1
        alpha = torch.exp(m_old - m_new)  # rescales what was summed under the old max
        denom[..., rows, :] = alpha * denom[..., rows, :] + p.sum(dim=-1, keepdim=True)
        acc[..., rows, :] = alpha * acc[..., rows, :] + p @ v[..., start:end, :]
        m[..., rows, :] = m_new
    return acc / denom  # normalise once, at the end


def flash_attention_with_bias(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_bias: torch.Tensor,
    block_size: int = 64,
) -> torch.Tensor:
    """Flash attention with a relative-position bias, computed tile by tile."""
    n_q, n_k = q.size(-2), k.size(-2)
    K = (rel_bias.size(-1) - 1) // 2  # the clipping distance
    q = q / math.sqrt(q.size(-1))  # the bias itself is not scaled
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))  # (..., h, n_q, 1)
    denom = q.new_zeros((*q.shape[:-1], 1))
    acc = q.new_zeros((*q.shape[:-1], v.size(-1)))  # (..., h, n_q, d_v)
    i = torch.arange(n_q, device=q.device)[:, None]  # global query positions
    for start in range(0, n_k, block_size):
        end = min(start + block_size, n_k)
        # the tile's bias, from the global positions of its keys: (h, n_q, b), never (n, n)
        j = torch.arange(start, end, device=q.device)[None, :]
        bias = rel_bias[:, (j - i).clamp(-K, K) + K]
        s = q @ k[..., start:end, :].transpose(-2, -1) + bias  # (..., h, n_q, b)
        biased_max = s.amax(dim=-1, keepdim=True)  # the bias takes part in the maximum
        m_new = torch.maximum(m, biased_max)
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        denom = alpha * denom + p.sum(dim=-1, keepdim=True)
        acc = alpha * acc + p @ v[..., start:end, :]
        m = m_new
    return acc / denom


def sliding_window_mask(
    n: int, window: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """(n, n) bool: query i may attend to key j exactly when |i - j| <= window."""
    positions = torch.arange(n, device=device)
    return (positions[:, None] - positions[None, :]).abs() <= window


def local_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int
) -> torch.Tensor:
    """Softmax attention restricted to |i - j| <= window, in O(n * window) memory."""
    n, w = q.size(-2), max(window, 1)  # blocks of w positions
    blocks = -(-n // w)  # ceil(n / w)
    extra = blocks * w - n  # padding that completes the last block
    # The queries of block b can only see keys in blocks b - 1, b and b + 1. Pad one block
    # of zeros in front and behind, then give each query block its three key blocks.
    q_blocks = F.pad(q, (0, 0, 0, extra)).unflatten(-2, (blocks, w))  # (..., nb, w, d)

    def neighbours(x):  # (..., n, e) -> (..., nb, 3w, e): blocks b - 1, b, b + 1
        x = F.pad(x, (0, 0, w, extra + w)).unflatten(-2, (blocks + 2, w))
        return torch.cat([x[..., :-2, :, :], x[..., 1:-1, :, :], x[..., 2:, :, :]], -2)

    scores = q_blocks @ neighbours(k).transpose(-2, -1) / math.sqrt(q.size(-1))
    # query b w + r against key (b - 1) w + c: keep |i - j| <= window and real keys only
    i = torch.arange(blocks * w, device=q.device).view(blocks, w, 1)  # (nb, w, 1)
    j = i - i % w - w + torch.arange(3 * w, device=q.device)  # (nb, w, 3w)
    allowed = ((i - j).abs() <= window) & (j >= 0) & (j < n)
    scores = scores.masked_fill(~allowed, float("-inf"))  # (..., nb, w, 3w)
    # the diagonal is always allowed, so no row is fully masked
    out = torch.softmax(scores, dim=-1) @ neighbours(v)  # (..., nb, w, d_v)
    return out.flatten(-3, -2)[..., :n, :]  # (..., n, d_v)


def linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """Katharopoulos et al.'s linear attention with the feature map elu(x) + 1."""
    phi_q = F.elu(q) + 1  # (..., n_q, d), every entry > 0
    phi_k = F.elu(k) + 1  # (..., n_k, d)
    if not causal:
        kv = phi_k.transpose(-2, -1) @ v  # (..., d, d_v) = sum_j phi(k_j) v_j^T
        z = phi_k.sum(dim=-2)  # (..., d) = sum_j phi(k_j)
        return (phi_q @ kv) / (phi_q @ z.unsqueeze(-1))  # (..., n_q, d_v)
    # causal: the same sums over j <= i, as inclusive prefix sums along the sequence
    kv = torch.cumsum(phi_k.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)  # (..., n, d, d_v)
    z = torch.cumsum(phi_k, dim=-2)  # (..., n, d)
    numerator = (phi_q.unsqueeze(-2) @ kv).squeeze(-2)  # (..., n, d_v)
    denominator = (phi_q * z).sum(dim=-1, keepdim=True)  # (..., n, 1)
    return numerator / denominator


def performer_features(x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """FAVOR+ positive random features: exp(w_r . x - |x|^2 / 2) / sqrt(m)."""
    m = projection.size(0)
    projected = x @ projection.transpose(-2, -1)  # (..., n, m): w_r . x
    half_norm = (x * x).sum(dim=-1, keepdim=True) / 2  # (..., n, 1)
    return torch.exp(projected - half_norm) / math.sqrt(m)


def performer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_features: int,
    projection: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention approximated with positive random features (Performer, FAVOR+)."""
    d = q.size(-1)
    if projection is None:
        projection = torch.randn(num_features, d, dtype=q.dtype, device=q.device)
    # exp(q.k / sqrt(d)) = exp(q'.k') with q' = q / d^(1/4) and k' = k / d^(1/4)
    scale = d**-0.25
    phi_q = performer_features(q * scale, projection)  # (..., n_q, m)
    phi_k = performer_features(k * scale, projection)  # (..., n_k, m)
    kv = phi_k.transpose(-2, -1) @ v  # (..., m, d_v)
    z = phi_k.sum(dim=-2)  # (..., m)
    return (phi_q @ kv) / (phi_q @ z.unsqueeze(-1))  # (..., n_q, d_v)


def linformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    proj_k: torch.Tensor,
    proj_v: torch.Tensor,
) -> torch.Tensor:
    """Linformer: keys and values projected along the sequence axis to length k (the
    paper's E is proj_k, its F proj_v)."""
    keys = proj_k @ k  # (k, n_k) @ (..., n_k, d) -> (..., k, d)
    values = proj_v @ v  # (..., k, d_v)
    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., n_q, k)
    return torch.softmax(scores, dim=-1) @ values  # (..., n_q, d_v)


def grouped_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention with g key/value heads shared by h query heads; head j reads j // (h // g)."""
    h, g = q.size(-3), k.size(-3)
    if h % g:
        raise ValueError(f"{h} query heads cannot share {g} key/value heads evenly")
    r, n_q, n_k = h // g, q.size(-2), k.size(-2)  # r query heads per key/value head
    # Query heads i*r ... i*r + r - 1 all read key/value head i. Stack those r heads along
    # the sequence axis, so one product per group serves them and k, v are never copied.
    batch = q.shape[:-3]
    q_grouped = q.reshape(*batch, g, r * n_q, q.size(-1))  # (..., g, r n_q, d)
    # (..., g, r n_q, n_k): every query of a group against the group's keys
    scores = q_grouped @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores.reshape(*batch, h, n_q, n_k)  # one row per query head again
    if mask is not None:
        # the most negative float, not -inf, so that a fully masked row gives no NaN
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., h, n_q, n_k)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # a fully masked row: zero output
    out = weights.reshape(*batch, g, r * n_q, n_k) @ v  # (..., g, r n_q, d_v)
    return out.reshape(*batch, h, n_q, v.size(-1))  # (..., h, n_q, d_v)


def kv_cache_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One causal decoding step: append the new keys and values, attend over the cache."""
    keys, values = k_t, v_t  # (B, g, s, d), (B, g, s, d_v)
    if cache is not None:
        keys = torch.cat([cache[0], k_t], dim=-2)  # (B, g, t + s, d)
        values = torch.cat([cache[1], v_t], dim=-2)  # (B, g, t + s, d_v)
    s, total = q_t.size(-2), keys.size(-2)
    # new query i sits at position total - s + i and may see the keys up to and including it
    position = torch.arange(total - s, total, device=q_t.device)[:, None]  # (s, 1)
    mask = torch.arange(total, device=q_t.device)[None, :] <= position  # (s, t + s)
    out = grouped_query_attention(q_t, keys, values, mask)  # (B, h, s, d_v)
    return out, (keys, values)


class FlashAttentionFunction(torch.autograd.Function):
    """FlashAttention-2 with its own backward pass (Dao 2024, Algorithms 1 and 2).

    The forward saves q, k, v, the output and one number per query row, the log-sum-exp
    L = m + log(l); the backward recomputes each tile's probabilities as exp(s - L).
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_size=64):
        n_q, n_k, b = q.size(-2), k.size(-2), block_size
        scale = 1.0 / math.sqrt(q.size(-1))
        out = q.new_empty((*q.shape[:-1], v.size(-1)))  # (..., n_q, d_v)
        lse = q.new_empty(q.shape[:-1])  # (..., n_q): L, one number per query row
        # one query tile at a time (on a GPU: one program each)
        for qs in range(0, n_q, b):
            qe = min(qs + b, n_q)
            q_tile = q[..., qs:qe, :] * scale  # (..., b_q, d)
            m = q.new_full((*q_tile.shape[:-1], 1), float("-inf"))  # running max
            denom = q.new_zeros((*q_tile.shape[:-1], 1))  # running sum, relative to m
            acc = q.new_zeros((*q_tile.shape[:-1], v.size(-1)))  # (..., b_q, d_v)
            # causal: key tiles that start after this tile's last query are skipped
            stop = min(n_k, qe) if causal else n_k
            for ks in range(0, stop, b):
                ke = min(ks + b, n_k)
                s = q_tile @ k[..., ks:ke, :].transpose(-2, -1)  # (..., b_q, b_k)
                if causal and ks == qs:  # the diagonal tile: hide keys j > i
                    i = torch.arange(qs, qe, device=q.device)[:, None]
                    j = torch.arange(ks, ke, device=q.device)[None, :]
                    s = s.masked_fill(j > i, float("-inf"))
                m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
                p = torch.exp(s - m_new)  # (..., b_q, b_k)
                alpha = torch.exp(m - m_new)  # rescales the sums under the old max
                denom = alpha * denom + p.sum(dim=-1, keepdim=True)
                acc = alpha * acc + p @ v[..., ks:ke, :]
                m = m_new
            out[..., qs:qe, :] = acc / denom
            lse[..., qs:qe] = (m + torch.log(denom)).squeeze(-1)  # L = m + log(l)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_size = causal, block_size
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, b = ctx.causal, ctx.block_size
        n_q, n_k = q.size(-2), k.size(-2)
        scale = 1.0 / math.sqrt(q.size(-1))
        # D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij: the softmax's gradient needs it per row
        big_d = (d_out * out).sum(dim=-1)  # (..., n_q)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for ks in range(0, n_k, b):  # one key tile at a time, its dK and dV kept local
            ke = min(ks + b, n_k)
            k_tile = k[..., ks:ke, :]  # (..., b_k, d)
            v_tile = v[..., ks:ke, :]  # (..., b_k, d_v)
            dk_tile, dv_tile = torch.zeros_like(k_tile), torch.zeros_like(v_tile)
            # causal: query tiles that end before this tile's first key see none of it
            for qs in range(ks if causal else 0, n_q, b):
                qe = min(qs + b, n_q)
                q_tile, do_tile = q[..., qs:qe, :], d_out[..., qs:qe, :]
                s = q_tile @ k_tile.transpose(-2, -1) * scale  # (..., b_q, b_k)
                # the tile's weights, recomputed from L: exp(s - L) is already normalised
                p = torch.exp(s - lse[..., qs:qe, None])  # (..., b_q, b_k)
                if causal and qs == ks:  # the diagonal tile: keys j > i got no weight
                    i = torch.arange(qs, qe, device=q.device)[:, None]
                    j = torch.arange(ks, ke, device=q.device)[None, :]
                    p = p.masked_fill(j > i, 0.0)
                dv_tile += p.transpose(-2, -1) @ do_tile  # (..., b_k, d_v)
                dp = do_tile @ v_tile.transpose(-2, -1)  # (..., b_q, b_k)
                ds = p * (dp - big_d[..., qs:qe, None])  # the softmax's gradient
                dq[..., qs:qe, :] += ds @ k_tile * scale
                dk_tile += ds.transpose(-2, -1) @ q_tile * scale
            dk[..., ks:ke, :] = dk_tile
            dv[..., ks:ke, :] = dv_tile
        return dq, dk, dv, None, None  # no gradients for causal and block_size


def flash_attention_autograd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_size: int = 64,
) -> torch.Tensor:
    """Exact softmax attention whose backward pass recomputes its tiles (FlashAttention-2)."""
    return FlashAttentionFunction.apply(q, k, v, causal, block_size)

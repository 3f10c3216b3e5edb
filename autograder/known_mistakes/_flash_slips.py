"""FlashAttention-2's forward and backward with one deliberate slip each: the known
mistakes of chapter 8's ``FlashAttentionFunction`` and chapter 11's Triton kernels, which
compute the same numbers (chapter 11's tests compare its gradients with chapter 8's)."""

import math

import torch


def wrong_flash_function(
    *,
    rescale_sum=True,
    lse_with_max=True,
    d_from="output",
    causal_start=0,
    scale_grads=True,
):
    """An autograd function like ``FlashAttentionFunction`` with one slip:

    - ``rescale_sum`` False: the running sum l is not multiplied by exp(m_old - m_new);
    - ``lse_with_max`` False: L saved as log(l), without the running maximum m;
    - ``d_from`` "tile": D as rowsum(P * dP) of the current key tile only, not
      rowsum(dO * O) over every key;
    - ``causal_start`` +1: the backward starts each key tile's query loop one tile late
      (the diagonal tile skipped); -1: one tile early (a tile wholly above the diagonal
      processed, and only the diagonal tile masked);
    - ``scale_grads`` False: dQ and dK miss the factor 1 / sqrt(d).
    """

    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=False, block_size=64):
            n_q, n_k, b = q.size(-2), k.size(-2), block_size
            scale = 1.0 / math.sqrt(q.size(-1))
            out = q.new_empty((*q.shape[:-1], v.size(-1)))
            lse = q.new_empty(q.shape[:-1])
            for qs in range(0, n_q, b):
                qe = min(qs + b, n_q)
                q_tile = q[..., qs:qe, :] * scale
                m = q.new_full((*q_tile.shape[:-1], 1), float("-inf"))
                denom = q.new_zeros((*q_tile.shape[:-1], 1))
                acc = q.new_zeros((*q_tile.shape[:-1], v.size(-1)))
                for ks in range(0, min(n_k, qe) if causal else n_k, b):
                    ke = min(ks + b, n_k)
                    s = q_tile @ k[..., ks:ke, :].transpose(-2, -1)
                    if causal:
                        i = torch.arange(qs, qe)[:, None]
                        s = s.masked_fill(torch.arange(ks, ke)[None, :] > i, -math.inf)
                    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
                    p = torch.exp(s - m_new)
                    alpha = torch.exp(m - m_new)
                    denom = (alpha if rescale_sum else 1.0) * denom + p.sum(-1, True)
                    acc = alpha * acc + p @ v[..., ks:ke, :]
                    m = m_new
                out[..., qs:qe, :] = acc / denom
                lse[..., qs:qe] = (
                    (m if lse_with_max else 0.0) + torch.log(denom)
                ).squeeze(-1)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.causal, ctx.block_size = causal, block_size
            return out

        @staticmethod
        def backward(ctx, d_out):
            q, k, v, out, lse = ctx.saved_tensors
            causal, b = ctx.causal, ctx.block_size
            n_q, n_k = q.size(-2), k.size(-2)
            scale = 1.0 / math.sqrt(q.size(-1))
            grad_scale = scale if scale_grads else 1.0
            big_d = (d_out * out).sum(dim=-1)
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            for ks in range(0, n_k, b):
                ke = min(ks + b, n_k)
                k_tile, v_tile = k[..., ks:ke, :], v[..., ks:ke, :]
                first = max(ks + causal_start * b, 0) if causal else 0
                for qs in range(first, n_q, b):
                    qe = min(qs + b, n_q)
                    q_tile, do_tile = q[..., qs:qe, :], d_out[..., qs:qe, :]
                    s = q_tile @ k_tile.transpose(-2, -1) * scale
                    p = torch.exp(s - lse[..., qs:qe, None])
                    if causal and qs == ks:
                        i = torch.arange(qs, qe)[:, None]
                        p = p.masked_fill(torch.arange(ks, ke)[None, :] > i, 0.0)
                    dv[..., ks:ke, :] += p.transpose(-2, -1) @ do_tile
                    dp = do_tile @ v_tile.transpose(-2, -1)
                    rows = big_d[..., qs:qe, None]
                    if d_from == "tile":
                        rows = (p * dp).sum(dim=-1, keepdim=True)
                    ds = p * (dp - rows)
                    dq[..., qs:qe, :] += ds @ k_tile * grad_scale
                    dk[..., ks:ke, :] += ds.transpose(-2, -1) @ q_tile * grad_scale
            return dq, dk, dv, None, None

    return Wrong


# name, hint, slips: shared by the two chapters; each wraps the function in its own API.
# The first three concern any call, the rest the gradients' scale and causal tiles.
SLIPS = [
    (
        "running sum not rescaled",
        "when the running maximum grows, is the running sum l multiplied by "
        "exp(m_old - m_new) before the new tile's sum is added?",
        dict(rescale_sum=False),
    ),
    (
        "L saved without the max",
        "your gradients look as if L = log(l) were saved: the tiles' scores were "
        "shifted by the running maximum m, so L = m + log(l), and exp(s - L) is the weight.",
        dict(lse_with_max=False),
    ),
    (
        "D from one tile",
        "D_i is rowsum(dO_i * O_i), one number per query row over all the keys; "
        "rowsum(P * dP) of a single key tile is only that tile's part of it.",
        dict(d_from="tile"),
    ),
    (
        "gradients of q and k unscaled",
        "s = q k^T / sqrt(d), so dQ = dS K / sqrt(d) and dK = dS^T Q / sqrt(d): is the "
        "factor 1 / sqrt(d) in both?",
        dict(scale_grads=False),
    ),
    (
        "causal: diagonal tile skipped (one tile too early)",
        "with causal=True, the query tile that holds the diagonal (the one that starts where "
        "the key tile starts) still sees part of the key tile: skip only the query tiles "
        "before it.",
        dict(causal_start=1),
    ),
    (
        "causal: a tile above the diagonal processed (one tile too late)",
        "with causal=True, the query tile before the diagonal tile sees none of the key "
        "tile's keys: skip it, or mask it; masking only the diagonal tile is enough only "
        "when every tile above it is skipped.",
        dict(causal_start=-1),
    ),
]

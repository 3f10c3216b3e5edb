"""Chapter 11, kernels: FlashAttention-2 written in Triton (reference implementations).

The kernels run compiled on a CUDA GPU and, where there is none, in Triton's interpreter
(``TRITON_INTERPRET=1``, set below before triton is imported), which runs them on CPU
tensors with NumPy: slowly, but exactly as written, so they can be graded on any machine.
"""

import math
import os

import torch

if not torch.cuda.is_available():  # before triton is imported: it reads this once
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def flash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # (BH, n_q, D), (BH, n_k, D), (BH, n_k, DV), (BH, n_q, DV), (BH, n_q)
    n_q, n_k, scale,
    D: tl.constexpr, DV: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """One program per (query tile, batch x head): the online softmax over the key tiles."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    rows = tile * BLOCK_Q + tl.arange(0, BLOCK_Q)  # (BLOCK_Q,) query positions
    dims, dims_v = tl.arange(0, D), tl.arange(0, DV)
    q = tl.load(
        q_ptr + bh * n_q * D + rows[:, None] * D + dims[None, :],
        mask=rows[:, None] < n_q,
        other=0.0,
    )  # (BLOCK_Q, D); rows past n_q read zeros and are never stored
    m = tl.full((BLOCK_Q,), float("-inf"), tl.float32)  # running max
    denom = tl.zeros((BLOCK_Q,), tl.float32)  # running sum l
    acc = tl.zeros((BLOCK_Q, DV), tl.float32)  # running unnormalised output
    hi = n_k
    if CAUSAL:  # key tiles that start after this tile's last query are never loaded
        hi = tl.minimum(n_k, (tile + 1) * BLOCK_Q)
    for start in range(0, hi, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)  # (BLOCK_K,) key positions
        k = tl.load(
            k_ptr + bh * n_k * D + cols[:, None] * D + dims[None, :],
            mask=cols[:, None] < n_k,
            other=0.0,
        )  # (BLOCK_K, D)
        # "ieee": true float32 products; the default on a GPU rounds inputs to TF32
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_Q, BLOCK_K)
        hidden = cols[None, :] >= n_k  # keys past the end
        if CAUSAL:
            hidden = hidden | (cols[None, :] > rows[:, None])
        s = tl.where(hidden, float("-inf"), s)
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])  # (BLOCK_Q, BLOCK_K)
        alpha = tl.exp(m - m_new)  # rescales what was summed under the old max
        denom = alpha * denom + tl.sum(p, 1)
        v = tl.load(
            v_ptr + bh * n_k * DV + cols[:, None] * DV + dims_v[None, :],
            mask=cols[:, None] < n_k,
            other=0.0,
        )  # (BLOCK_K, DV)
        acc = alpha[:, None] * acc + tl.dot(p, v, input_precision="ieee")
        m = m_new
    keep = rows < n_q
    tl.store(
        o_ptr + bh * n_q * DV + rows[:, None] * DV + dims_v[None, :],
        acc / denom[:, None],
        mask=keep[:, None],
    )
    tl.store(lse_ptr + bh * n_q + rows, m + tl.log(denom), mask=keep)  # L = m + log(l)


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10 mantissa bits (to nearest), as a GPU's tensor cores read
    the inputs of ``tl.dot`` on float32 unless ``input_precision="ieee"``. Triton's
    interpreter ignores ``input_precision``, so this is how the pitfall shows on a CPU."""
    bits = x.float().contiguous().view(torch.int32)
    # add half of the dropped part, then drop the 13 low bits (carries into the exponent)
    rounded = (bits + 0x1000) & ~0x1FFF
    return rounded.view(torch.float32)


def _blocks(device) -> int:
    """Tiles of 64 on a GPU; of 16 in the interpreter, so that small inputs have several."""
    return 64 if device.type == "cuda" else 16


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(..., n, d) -> (BH, n, d), contiguous: one row of the grid per batch x head."""
    return x.reshape(-1, x.size(-2), x.size(-1)).contiguous()


def flash_attention_triton(q, k, v, causal=False):
    """FlashAttention-2's forward pass in Triton: returns (out, L)."""
    for name, width in (("d", q.size(-1)), ("d_v", v.size(-1))):
        if width < 16 or width & (width - 1):  # tl.arange and tl.dot need it
            raise ValueError(f"{name} = {width}: the kernels need a power of two >= 16")
    n_q, n_k, d, d_v = q.size(-2), k.size(-2), q.size(-1), v.size(-1)
    qf, kf, vf = _flat(q), _flat(k), _flat(v)
    out = torch.empty(qf.size(0), n_q, d_v, device=q.device, dtype=torch.float32)
    lse = torch.empty(qf.size(0), n_q, device=q.device, dtype=torch.float32)
    block = _blocks(q.device)
    grid = (triton.cdiv(n_q, block), qf.size(0))  # (query tiles, batch x heads)
    flash_fwd_kernel[grid](
        qf, kf, vf, out, lse, n_q, n_k, 1.0 / math.sqrt(d),
        D=d, DV=d_v, BLOCK_Q=block, BLOCK_K=block, CAUSAL=causal,
    )  # fmt: skip
    return out.reshape(*q.shape[:-1], d_v), lse.reshape(q.shape[:-1])


@triton.jit
def flash_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    n_q, n_k, scale,
    D: tl.constexpr, DV: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """One program per (key tile, batch x head): dK and dV summed over the query tiles."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    cols = tile * BLOCK_K + tl.arange(0, BLOCK_K)  # (BLOCK_K,) key positions
    dims, dims_v = tl.arange(0, D), tl.arange(0, DV)
    key_ok = cols[:, None] < n_k
    k = tl.load(
        k_ptr + bh * n_k * D + cols[:, None] * D + dims[None, :], mask=key_ok, other=0.0
    )
    v = tl.load(
        v_ptr + bh * n_k * DV + cols[:, None] * DV + dims_v[None, :],
        mask=key_ok,
        other=0.0,
    )
    dk = tl.zeros((BLOCK_K, D), tl.float32)
    dv = tl.zeros((BLOCK_K, DV), tl.float32)
    lo = 0
    if CAUSAL:  # query tiles that end before this tile's first key see none of it
        lo = (tile * BLOCK_K // BLOCK_Q) * BLOCK_Q
    for start in range(lo, n_q, BLOCK_Q):
        rows = start + tl.arange(0, BLOCK_Q)
        row_ok = rows < n_q
        q = tl.load(
            q_ptr + bh * n_q * D + rows[:, None] * D + dims[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
        do = tl.load(
            do_ptr + bh * n_q * DV + rows[:, None] * DV + dims_v[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
        lse = tl.load(lse_ptr + bh * n_q + rows, mask=row_ok, other=0.0)
        delta = tl.load(delta_ptr + bh * n_q + rows, mask=row_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_Q, BLOCK_K)
        p = tl.exp(s - lse[:, None])  # the weights, recomputed from L
        hidden = (cols[None, :] >= n_k) | (rows[:, None] >= n_q)
        if CAUSAL:
            hidden = hidden | (cols[None, :] > rows[:, None])
        p = tl.where(hidden, 0.0, p)
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")  # (BLOCK_K, DV)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")  # (BLOCK_Q, BLOCK_K)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee") * scale  # (BLOCK_K, D)
    tl.store(dk_ptr + bh * n_k * D + cols[:, None] * D + dims[None, :], dk, mask=key_ok)
    tl.store(
        dv_ptr + bh * n_k * DV + cols[:, None] * DV + dims_v[None, :], dv, mask=key_ok
    )


@triton.jit
def flash_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    n_q, n_k, scale,
    D: tl.constexpr, DV: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """One program per (query tile, batch x head): dQ summed over the key tiles (no atomics)."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    rows = tile * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dims, dims_v = tl.arange(0, D), tl.arange(0, DV)
    row_ok = rows < n_q
    q = tl.load(
        q_ptr + bh * n_q * D + rows[:, None] * D + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    do = tl.load(
        do_ptr + bh * n_q * DV + rows[:, None] * DV + dims_v[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    lse = tl.load(lse_ptr + bh * n_q + rows, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + bh * n_q + rows, mask=row_ok, other=0.0)
    dq = tl.zeros((BLOCK_Q, D), tl.float32)
    hi = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, (tile + 1) * BLOCK_Q)
    for start in range(0, hi, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        key_ok = cols[:, None] < n_k
        k = tl.load(
            k_ptr + bh * n_k * D + cols[:, None] * D + dims[None, :],
            mask=key_ok,
            other=0.0,
        )
        v = tl.load(
            v_ptr + bh * n_k * DV + cols[:, None] * DV + dims_v[None, :],
            mask=key_ok,
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        p = tl.exp(s - lse[:, None])
        hidden = cols[None, :] >= n_k
        if CAUSAL:
            hidden = hidden | (cols[None, :] > rows[:, None])
        p = tl.where(hidden, 0.0, p)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds, k, input_precision="ieee") * scale
    tl.store(
        dq_ptr + bh * n_q * D + rows[:, None] * D + dims[None, :],
        dq,
        mask=row_ok[:, None],
    )


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton: the forward kernel, then two backward kernels."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        out, lse = flash_attention_triton(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        n_q, n_k, d, d_v = q.size(-2), k.size(-2), q.size(-1), v.size(-1)
        delta = (d_out * out).sum(-1)  # D = rowsum(dO * O), (..., n_q)
        qf, kf, vf, dof = _flat(q), _flat(k), _flat(v), _flat(d_out)
        lsef, deltaf = (
            lse.reshape(-1, n_q).contiguous(),
            delta.reshape(-1, n_q).contiguous(),
        )
        dq, dk, dv = torch.empty_like(qf), torch.empty_like(kf), torch.empty_like(vf)
        block, bh = _blocks(q.device), qf.size(0)
        args = (n_q, n_k, 1.0 / math.sqrt(d))
        meta = dict(D=d, DV=d_v, BLOCK_Q=block, BLOCK_K=block, CAUSAL=ctx.causal)
        flash_bwd_dkdv_kernel[(triton.cdiv(n_k, block), bh)](
            qf, kf, vf, dof, lsef, deltaf, dk, dv, *args, **meta
        )
        flash_bwd_dq_kernel[(triton.cdiv(n_q, block), bh)](
            qf, kf, vf, dof, lsef, deltaf, dq, *args, **meta
        )
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None

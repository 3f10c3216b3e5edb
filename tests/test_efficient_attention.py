"""Chapter 8, efficient attention: the references against PyTorch and the papers' formulas,
their memory, and the hidden tests against answers written independently of them."""

import math

import jupytext
import pytest
import torch
import torch.nn.functional as F

from autograder import paths
from solutions import efficient_attention as ea
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    verdicts,
    wrong_answers,
)

CHAPTER = "08_efficient_attention"


def _qkv(*batch, n_q=10, n_k=10, d=8, d_v=8, scale=1.0):
    return (
        torch.randn(*batch, n_q, d) * scale,
        torch.randn(*batch, n_k, d) * scale,
        torch.randn(*batch, n_k, d_v),
    )


# ------------------------------------------------------- references against PyTorch


@pytest.mark.parametrize(
    "batch, n_q, n_k, d, d_v, scale",
    [
        ((), 7, 7, 4, 4, 1.0),
        ((3,), 10, 13, 8, 5, 1.0),
        ((2, 4), 33, 33, 16, 16, 1.0),
        ((2,), 12, 12, 16, 16, 10.0),  # very large logits
        ((1, 2), 5, 9, 8, 3, 3.0),
    ],
)
@pytest.mark.parametrize("block", [1, 4, 5, 64])
def test_chunked_and_flash_equal_sdpa(batch, n_q, n_k, d, d_v, scale, block):
    torch.manual_seed(0)
    q, k, v = _qkv(*batch, n_q=n_q, n_k=n_k, d=d, d_v=d_v, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(ea.chunked_attention(q, k, v, block), expected)
    torch.testing.assert_close(ea.flash_attention(q, k, v, block), expected)
    # causal, with SDPA's alignment (query i sees keys j <= i) also when n_q != n_k
    torch.testing.assert_close(
        ea.flash_attention(q, k, v, block, causal=True),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )


def _with_grads(attend, q, k, v, d_out):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = attend(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), d_out))


@pytest.mark.parametrize(
    "batch, n_q, n_k, d, d_v, scale, block",
    [
        ((), 7, 7, 4, 4, 1.0, 1),
        ((3,), 10, 13, 8, 5, 1.0, 4),
        ((2,), 13, 6, 8, 8, 1.0, 3),
        ((2, 2), 33, 33, 16, 16, 1.0, 64),
        ((2,), 12, 12, 16, 16, 10.0, 5),  # very large logits
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_function_gradients_equal_autograd(
    batch, n_q, n_k, d, d_v, scale, block, causal
):
    """FlashAttentionFunction's hand-written backward equals autograd through SDPA, in
    float64 (so that the comparison is tight), with the top-left causal mask."""
    g = torch.Generator().manual_seed(n_q * 100 + n_k)
    q, k = (
        torch.randn(*batch, n, d, generator=g, dtype=torch.float64) * scale
        for n in (n_q, n_k)
    )
    v = torch.randn(*batch, n_k, d_v, generator=g, dtype=torch.float64)
    d_out = torch.randn(*batch, n_q, d_v, generator=g, dtype=torch.float64)
    mask = torch.ones(n_q, n_k, dtype=torch.bool).tril() if causal else None
    got = _with_grads(
        lambda q, k, v: ea.flash_attention_autograd(q, k, v, causal, block),
        q,
        k,
        v,
        d_out,
    )
    expected = _with_grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        q,
        k,
        v,
        d_out,
    )
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)


def test_flash_attention_function_saves_only_inputs_output_and_lse():
    q, k, v = _qkv(2, n_q=9, n_k=12, d=8, d_v=5)
    q.requires_grad_()
    out = ea.flash_attention_autograd(q, k, v, block_size=4)
    saved = out.grad_fn.saved_tensors
    assert [t.shape for t in saved] == [q.shape, k.shape, v.shape, out.shape, (2, 9)]
    torch.testing.assert_close(
        saved[4], torch.logsumexp(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    )


def test_flash_attention_keeps_dtype_and_device():
    q, k, v = _qkv(2, n_q=9, n_k=9)
    out = ea.flash_attention(q.double(), k.double(), v.double(), 4, causal=True)
    assert out.dtype == torch.float64
    torch.testing.assert_close(
        out,
        F.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), is_causal=True
        ),
    )


@pytest.mark.parametrize("n, window", [(11, 0), (11, 1), (11, 3), (7, 20), (1, 0)])
def test_local_attention_equals_sdpa_with_the_window_mask(n, window):
    torch.manual_seed(1)
    mask = ea.sliding_window_mask(n, window)
    assert mask.dtype == torch.bool and mask.shape == (n, n)
    for i in range(n):
        for j in range(n):
            assert bool(mask[i, j]) == (abs(i - j) <= window)
    q, k, v = _qkv(2, 3, n_q=n, n_k=n, d=8, d_v=5)
    torch.testing.assert_close(
        ea.local_attention(q, k, v, window),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )


def _explicit_linear(q, k, v, causal=False):
    """Katharopoulos et al. (2020), eq. 4 and 9: normalised elu(x) + 1 kernel, n x n."""
    kernel = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
    if causal:
        kernel = kernel * torch.ones(q.size(-2), k.size(-2)).tril()
    return kernel @ v / kernel.sum(-1, keepdim=True)


def test_linear_attention_matches_the_paper_formula_and_its_rnn_form():
    torch.manual_seed(2)
    q, k, v = _qkv(2, 3, n_q=9, n_k=12, d=8, d_v=5)
    torch.testing.assert_close(ea.linear_attention(q, k, v), _explicit_linear(q, k, v))
    q, k, v = _qkv(2, n_q=10, n_k=10, d=8, d_v=5)
    out = ea.linear_attention(q, k, v, causal=True)
    torch.testing.assert_close(out, _explicit_linear(q, k, v, causal=True))
    # the recurrent form: S_i = S_{i-1} + phi(k_i) v_i^T, z_i = z_{i-1} + phi(k_i)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    state, z = torch.zeros(2, 8, 5), torch.zeros(2, 8)
    for i in range(10):
        state = state + phi_k[:, i, :, None] * v[:, i, None, :]
        z = z + phi_k[:, i]
        expected = (phi_q[:, i, None, :] @ state).squeeze(1) / (phi_q[:, i] * z).sum(
            -1, keepdim=True
        )
        torch.testing.assert_close(out[:, i], expected)


def test_performer_features_estimate_the_softmax_kernel_without_bias():
    torch.manual_seed(3)
    x, y = torch.randn(3) * 0.5, torch.randn(3) * 0.5
    w = torch.randn(400_000, 3)
    phi_x, phi_y = ea.performer_features(x, w), ea.performer_features(y, w)
    assert phi_x.shape == (400_000,) and bool((phi_x > 0).all())
    assert abs((phi_x @ phi_y).item() / math.exp(x @ y) - 1) < 0.01


def test_performer_attention_converges_to_softmax_attention():
    torch.manual_seed(4)
    q, k, v = _qkv(2, n_q=16, n_k=16, d=8, d_v=4, scale=0.5)
    exact = F.scaled_dot_product_attention(q, k, v)
    errors = [
        (ea.performer_attention(q, k, v, m, torch.randn(m, 8)) - exact).abs().max()
        for m in (16, 200_000)
    ]
    assert errors[1] < 0.01 < errors[0]
    # the projection is drawn when none is given, and the result is then random
    assert ea.performer_attention(q, k, v, 32).shape == (2, 16, 4)


def test_linformer_with_identity_projections_is_softmax_attention():
    q, k, v = _qkv(2, 3, n_q=10, n_k=10, d=8, d_v=5)
    eye = torch.eye(10)
    torch.testing.assert_close(
        ea.linformer_attention(q, k, v, eye, eye),
        F.scaled_dot_product_attention(q, k, v),
    )
    # mean pooling of a sequence whose keys and values are constant over segments is exact
    k_seg, v_seg = torch.randn(2, 5, 8), torch.randn(2, 5, 3)
    pool = torch.zeros(5, 10)
    pool[torch.arange(10) // 2, torch.arange(10)] = 0.5
    torch.testing.assert_close(
        ea.linformer_attention(
            q[:, 0],
            k_seg.repeat_interleave(2, 1),
            v_seg.repeat_interleave(2, 1),
            pool,
            pool,
        ),
        F.scaled_dot_product_attention(q[:, 0], k_seg, v_seg),
    )


@pytest.mark.parametrize("h, g", [(8, 2), (6, 3), (4, 4), (6, 1)])
def test_grouped_query_attention_equals_sdpa_enable_gqa(h, g):
    torch.manual_seed(5)
    q, k, v = torch.randn(2, h, 5, 8), torch.randn(2, g, 7, 8), torch.randn(2, g, 7, 3)
    torch.testing.assert_close(
        ea.grouped_query_attention(q, k, v),
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    )
    mask = torch.rand(2, 1, 5, 7) < 0.5
    mask[..., 0] = True
    torch.testing.assert_close(
        ea.grouped_query_attention(q, k, v, mask),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
    )
    mask[1, 0, 2] = False  # a fully masked row: zeros, by the course's convention
    out = ea.grouped_query_attention(q, k, v, mask)
    assert torch.equal(out[1, :, 2], torch.zeros(h, 3))


def test_kv_cache_decoding_equals_full_causal_attention():
    torch.manual_seed(6)
    B, h, g, n = 2, 8, 2, 11
    q, k, v = torch.randn(B, h, n, 8), torch.randn(B, g, n, 8), torch.randn(B, g, n, 4)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    outs, cache = [], None
    for start, stop in [(0, 4), (4, 5), (5, 8), *[(t, t + 1) for t in range(8, n)]]:
        out, cache = ea.kv_cache_step(
            q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop], cache
        )
        outs.append(out)
        assert cache[0].shape == (B, g, stop, 8) and cache[1].shape == (B, g, stop, 4)
    torch.testing.assert_close(torch.cat(outs, dim=-2), full)
    torch.testing.assert_close(cache[0], k)
    torch.testing.assert_close(cache[1], v)


# ------------------------------------------------------------------- memory, measured


def _chapter_namespace() -> dict:
    """The chapter's own memory counter (`TensorMemory`, `peak_memory`): the code the
    students read is the code measured here."""
    cells = jupytext.read(paths.chapter_source(CHAPTER)).cells
    (source,) = [c.source for c in cells if "class TensorMemory" in c.source]
    namespace = {
        "torch": torch,
        "math": math,
        "time": __import__("time"),
        "glue": lambda name, value: None,  # the book's glue; nothing to hand on here
    }
    exec(source, namespace)
    return namespace


@pytest.fixture(scope="module")
def peak_memory():
    return _chapter_namespace()["peak_memory"]


@pytest.fixture
def one_thread():
    """The byte counts do not depend on threads; one thread keeps a shared CPU responsive."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_memory_counter_counts_what_is_allocated_and_freed(peak_memory):
    assert peak_memory(torch.zeros, 1000) == 4000
    x = torch.randn(100, 100)
    assert peak_memory(lambda: x.T.contiguous().view(-1)[:10]) == 40_000  # one copy
    assert peak_memory(lambda: x.add_(1)) == 0  # in place: nothing new
    assert peak_memory(lambda: [x @ x for _ in range(5)]) == 5 * 40_000  # all kept
    assert peak_memory(lambda: [(x @ x).sum() for _ in range(5)]) <= 2 * 40_000 + 8
    on_meta = torch.empty(1000, 1000, device="meta")
    assert (
        peak_memory(lambda: on_meta @ on_meta) == 4_000_000
    )  # shapes only, no arithmetic


def test_exact_and_local_attention_need_memory_linear_in_n(peak_memory, one_thread):
    """The efficient references really are efficient (chapter 8's claim, measured). At n = 8192 naive attention
    holds two (n, n) float32 matrices, 512 MiB; tiled attention a few MiB."""
    n, d = 8192, 32

    def naive_attention(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), -1) @ v

    # Naive attention is counted on the meta device (shapes only, no arithmetic), which
    # allocates exactly as the CPU does: checked at n = 1024.
    small = torch.randn(3, 1, 1, 1024, d)
    assert peak_memory(naive_attention, *small) == peak_memory(
        naive_attention, *small.to("meta")
    )
    naive = peak_memory(naive_attention, *torch.empty(3, 1, 1, n, d, device="meta"))
    assert naive >= 2 * 4 * n * n
    q, k, v = torch.randn(3, 1, 1, n, d)  # the efficient methods run for real
    flash = peak_memory(ea.flash_attention, q, k, v, block_size=64)
    flash_causal = peak_memory(ea.flash_attention, q, k, v, block_size=64, causal=True)
    chunked = peak_memory(ea.chunked_attention, q, k, v, 64)
    local = peak_memory(ea.local_attention, q, k, v, 16)
    linear = peak_memory(ea.linear_attention, q, k, v)
    assert max(flash, flash_causal) < naive / 20, (flash, flash_causal, naive)
    assert chunked < naive / 20 and local < naive / 20 and linear < naive / 20
    # and the peak grows linearly: doubling n doubles it (within rounding), not x4
    half = [torch.randn(1, 1, n // 2, d) for _ in range(3)]
    assert peak_memory(ea.flash_attention, *half, block_size=64) > flash / 2.2
    assert peak_memory(ea.flash_attention, *half, block_size=64) < flash / 1.8


def test_flash_backward_needs_memory_linear_in_n(peak_memory, one_thread):
    """Chapter 8's claim, measured: the backward pass of FlashAttentionFunction holds a few
    tiles, not the (n, n) weights, and its peak doubles when n doubles."""

    def backward_peak(attend, n, causal=False):
        q, k, v = (torch.randn(1, 1, n, 32, requires_grad=True) for _ in range(3))
        out = attend(q, k, v, causal)
        return peak_memory(
            torch.autograd.grad, out, (q, k, v), torch.randn(1, 1, n, 32)
        )

    def naive(q, k, v, causal):
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(32), -1) @ v

    flash = backward_peak(ea.flash_attention_autograd, 2048)
    assert flash < backward_peak(naive, 2048) / 10
    assert backward_peak(ea.flash_attention_autograd, 2048, causal=True) < 1.1 * flash
    # linear in n, plus a few tiles whatever n is
    assert 1.6 < flash / backward_peak(ea.flash_attention_autograd, 1024) < 2.2


def test_grouped_query_attention_does_not_copy_the_keys(peak_memory):
    q, k, v = (
        torch.randn(1, 8, 1, 64),
        torch.randn(1, 1, 4096, 64),
        torch.randn(1, 1, 4096, 64),
    )
    copied_kv = 2 * 8 * 4096 * 64 * 4  # k and v expanded to 8 heads
    assert peak_memory(ea.grouped_query_attention, q, k, v) < copied_kv / 8


# -------------------------------------------- hidden tests against independent answers


def _chunked_block_diagonal(q, k, v, chunk_size):
    """Each chunk of queries attends only to the chunk of keys with the same positions."""
    outs = []
    for s in range(0, q.size(-2), chunk_size):
        kk, vv = k[..., s : s + chunk_size, :], v[..., s : s + chunk_size, :]
        if kk.size(-2) == 0:
            kk, vv = k, v
        outs.append(
            F.softmax(
                q[..., s : s + chunk_size, :]
                @ kk.transpose(-2, -1)
                / math.sqrt(q.size(-1)),
                -1,
            )
            @ vv
        )
    return torch.cat(outs, dim=-2)


def _chunked_with_weights(q, k, v, chunk_size):
    out = ea.chunked_attention(q, k, v, chunk_size)
    return out, torch.softmax(q @ k.transpose(-2, -1), -1)


def _flash_without_max(q, k, v, block_size=64, causal=False):
    """Online sums of exp(s) with no maximum subtracted: overflows on large logits."""
    q = q / math.sqrt(q.size(-1))
    num = q.new_zeros((*q.shape[:-1], v.size(-1)))
    den = q.new_zeros((*q.shape[:-1], 1))
    for s in range(0, k.size(-2), block_size):
        scores = q @ k[..., s : s + block_size, :].transpose(-2, -1)
        if causal:
            hide = (
                torch.arange(s, s + scores.size(-1))[None, :]
                > torch.arange(q.size(-2))[:, None]
            )
            scores = scores.masked_fill(hide, float("-inf"))
        p = torch.exp(scores)
        num, den = (
            num + p @ v[..., s : s + block_size, :],
            den + p.sum(-1, keepdim=True),
        )
    return num / den


def _flash_bottom_right_causal(q, k, v, block_size=64, causal=False):
    """The causal mask aligned to the last key (j <= i + n_k - n_q), not SDPA's."""
    if not causal:
        return ea.flash_attention(q, k, v, block_size)
    shift = k.size(-2) - q.size(-2)
    mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril(shift)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(
        ~mask, float("-inf")
    )
    return (
        torch.exp(scores - scores.amax(-1, keepdim=True))
        @ v
        / torch.exp(scores - scores.amax(-1, keepdim=True)).sum(-1, keepdim=True)
    )


def _flash_half_precision(q, k, v, block_size=64, causal=False):
    return ea.flash_attention(q.half(), k.half(), v.half(), block_size, causal).float()


def _flash_block_softmax_average(q, k, v, block_size=64, causal=False):
    """Normalises each block on its own and averages the blocks' outputs."""
    outs = []
    for s in range(0, k.size(-2), block_size):
        outs.append(
            ea.flash_attention(
                q,
                k[..., s : s + block_size, :],
                v[..., s : s + block_size, :],
                block_size,
            )
        )
    return torch.stack(outs).mean(0)


def _bias_materialised(q, k, v, rel_bias, block_size=64):
    """The (h, n_q, n_k) bias of the table, formed whole; float64 softmax by hand."""
    K = (rel_bias.size(-1) - 1) // 2
    offset = torch.arange(k.size(-2))[None, :] - torch.arange(q.size(-2))[:, None]
    bias = rel_bias[:, offset.clamp(-K, K) + K].double()
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.size(-1)) + bias
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p / p.sum(-1, keepdim=True)) @ v.double()


def _bias_first_block_only(q, k, v, rel_bias, block_size=64):
    """Adds the bias to the first block of keys and leaves the other blocks unbiased."""
    K = (rel_bias.size(-1) - 1) // 2
    offset = torch.arange(k.size(-2))[None, :] - torch.arange(q.size(-2))[:, None]
    bias = rel_bias[:, offset.clamp(-K, K) + K]
    bias[..., block_size:] = 0.0
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    return p @ v / p.sum(-1, keepdim=True)


def _bias_as_alibi_slopes(q, k, v, rel_bias, block_size=64):
    """Reads the table as ALiBi: -m |i - j| with m taken from the column of offset +1."""
    K = (rel_bias.size(-1) - 1) // 2
    slope = -rel_bias[:, min(K + 1, 2 * K)]
    distance = (torch.arange(q.size(-2))[:, None] - torch.arange(k.size(-2))).abs()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores - slope[:, None, None] * distance
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    return p @ v / p.sum(-1, keepdim=True)


def _window_lower_band_only(n, window, device=None):
    return torch.ones(n, n, dtype=torch.bool).tril(window)


def _window_int(n, window, device=None):
    return ea.sliding_window_mask(n, window).long()


def _local_too_wide(q, k, v, window):
    return ea.local_attention(q, k, v, window + 1)


def _local_full_attention(q, k, v, window):
    return F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -1) @ v


def _linear_exp_kernel(q, k, v, causal=False):
    kernel = torch.exp(q @ k.transpose(-2, -1))
    if causal:
        kernel = kernel.tril()
    return kernel @ v / kernel.sum(-1, keepdim=True)


def _linear_cumsum_wrong_axis(q, k, v, causal=False):
    if not causal:
        return ea.linear_attention(q, k, v)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    kv = torch.cumsum(phi_k.unsqueeze(-1) * v.unsqueeze(-2), dim=-2)  # over features
    z = torch.cumsum(phi_k, dim=-1)
    return (phi_q.unsqueeze(-2) @ kv).squeeze(-2) / (phi_q * z).sum(-1, keepdim=True)


def _features_divided_by_m(x, projection):
    return ea.performer_features(x, projection) / math.sqrt(projection.size(0))


def _performer_own_projection(q, k, v, num_features, projection=None):
    return ea.performer_attention(
        q, k, v, num_features, torch.randn(num_features, q.size(-1))
    )


def _linformer_e_for_both(q, k, v, proj_k, proj_v):
    return ea.linformer_attention(q, k, v, proj_k, proj_k)


def _gqa_expand_wrong_order(q, k, v, mask=None):
    B, h, g = q.size(0), q.size(1), k.size(1)
    k = k[:, None].expand(B, h // g, *k.shape[1:]).reshape(B, h, *k.shape[2:])
    v = v[:, None].expand(B, h // g, *v.shape[1:]).reshape(B, h, *v.shape[2:])
    return ea.grouped_query_attention(q, k, v, mask)


def _gqa_inf_fill(q, k, v, mask=None):
    r = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def _kv_stacked_cache(q_t, k_t, v_t, cache=None):
    """Returns the cache as one tensor, keys and values side by side, not as a pair."""
    out, (keys, values) = ea.kv_cache_step(q_t, k_t, v_t, cache)
    return out, torch.cat([keys, values], dim=-1)


def _kv_no_cache(q_t, k_t, v_t, cache=None):
    out, _ = ea.kv_cache_step(q_t, k_t, v_t, None)
    return out, (k_t, v_t)


def _top_left(n_q, n_k):
    return torch.ones(n_q, n_k, dtype=torch.bool).tril()


def _flash_autograd_detached(q, k, v, causal=False, block_size=64):
    """Right numbers, but no gradient flows: the output is detached."""
    return ea.flash_attention(q, k, v, block_size, causal).detach()


def _flash_autograd_bottom_right(q, k, v, causal=False, block_size=64):
    """Causal mask aligned bottom-right (the key-value cache's), not top-left."""
    mask = None
    if causal:
        mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril(
            k.size(-2) - q.size(-2)
        )
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


class _NoKeyGradient(torch.autograd.Function):
    """The forward through naive attention, and a backward that forgets dK."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if causal:
            scores = scores.masked_fill(
                ~_top_left(q.size(-2), k.size(-2)), float("-inf")
            )
        a = torch.softmax(scores, -1)
        ctx.save_for_backward(k, v, a)
        return a @ v

    @staticmethod
    def backward(ctx, d_out):
        k, v, a = ctx.saved_tensors
        ds = a * (d_out @ v.transpose(-2, -1) - (d_out * (a @ v)).sum(-1, keepdim=True))
        dq = ds @ k / math.sqrt(k.size(-1))
        return dq, torch.zeros_like(k), a.transpose(-2, -1) @ d_out, None


def _flash_autograd_no_key_gradient(q, k, v, causal=False, block_size=64):
    return _NoKeyGradient.apply(q, k, v, causal)


class _DetachedFunction(torch.autograd.Function):
    """Right outputs, but a backward that returns no gradient at all."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_size=64):
        return ea.flash_attention(q, k, v, block_size, causal)

    @staticmethod
    def backward(ctx, d_out):
        return None, None, None, None, None


class _NoKeyGradientFunction(torch.autograd.Function):
    """FlashAttentionFunction's signature around _NoKeyGradient."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_size=64):
        ctx.save_for_backward(q, k, v)
        ctx.causal = causal
        return ea.flash_attention(q, k, v, block_size, causal)

    @staticmethod
    def backward(ctx, d_out):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
            out = _NoKeyGradient.apply(q, k, v, ctx.causal)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), d_out)
        return dq, dk, dv, None, None


INDEPENDENT_WRONG_ANSWERS = {
    "flash_attention_autograd": {
        _flash_autograd_detached: ["ea_flash_autograd"],
        _flash_autograd_bottom_right: ["ea_flash_autograd"],
        _flash_autograd_no_key_gradient: ["ea_flash_autograd"],
    },
    "FlashAttentionFunction": {
        _DetachedFunction: ["ea_flash_grad", "ea_flash_grad_causal"],
        _NoKeyGradientFunction: ["ea_flash_grad", "ea_flash_grad_causal"],
    },
    "chunked_attention": {
        _chunked_block_diagonal: ["ea_chunked"],
        _chunked_with_weights: ["ea_chunked"],
    },
    "flash_attention": {
        _flash_without_max: ["ea_flash", "ea_flash_causal"],
        _flash_bottom_right_causal: ["ea_flash_causal"],
        _flash_half_precision: ["ea_flash", "ea_flash_causal"],
        _flash_block_softmax_average: ["ea_flash"],
    },
    "flash_attention_with_bias": {
        _bias_first_block_only: ["ea_flash_bias"],
        _bias_as_alibi_slopes: ["ea_flash_bias"],
    },
    "sliding_window_mask": {
        _window_lower_band_only: ["ea_window_mask"],
        _window_int: ["ea_window_mask"],
    },
    "local_attention": {
        _local_too_wide: ["ea_local"],
        _local_full_attention: ["ea_local"],
    },
    "linear_attention": {
        _linear_exp_kernel: ["ea_linear", "ea_linear_causal"],
        _linear_cumsum_wrong_axis: ["ea_linear_causal"],
    },
    "performer_features": {_features_divided_by_m: ["ea_performer_features"]},
    "performer_attention": {_performer_own_projection: ["ea_performer"]},
    "linformer_attention": {_linformer_e_for_both: ["ea_linformer"]},
    "grouped_query_attention": {
        _gqa_expand_wrong_order: ["ea_gqa", "ea_gqa_masked"],
        _gqa_inf_fill: ["ea_gqa_masked"],
    },
    "kv_cache_step": {
        _kv_stacked_cache: ["ea_kv_cache"],
        _kv_no_cache: ["ea_kv_cache"],
    },
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails(CHAPTER, ea, exercise, wrong, test_ids)


def _chunked_split_einsum(q, k, v, chunk_size):
    outs = []
    for q_chunk in q.split(chunk_size, dim=-2):
        scores = torch.einsum("...id,...jd->...ij", q_chunk, k) / q.shape[-1] ** 0.5
        outs.append(torch.einsum("...ij,...jd->...id", scores.softmax(-1), v))
    return torch.cat(outs, dim=-2)


def _flash_two_level_tiles(q, k, v, block_size=64, causal=False):
    """FlashAttention-2's loops: query tiles outside, key tiles inside, float64 sums."""
    out = torch.empty(*q.shape[:-1], v.size(-1), dtype=torch.float64)
    scale = q.size(-1) ** -0.5
    for qs in range(0, q.size(-2), block_size):
        qi = q[..., qs : qs + block_size, :].double() * scale
        rows = torch.arange(qs, qs + qi.size(-2))[:, None]
        m = torch.full((*qi.shape[:-1], 1), -1e300, dtype=torch.float64)
        den = torch.zeros_like(m)
        acc = torch.zeros(*qi.shape[:-1], v.size(-1), dtype=torch.float64)
        for ks in range(0, k.size(-2), block_size):
            if causal and ks > rows.max():
                break
            s = qi @ k[..., ks : ks + block_size, :].double().transpose(-2, -1)
            if causal:
                cols = torch.arange(ks, ks + s.size(-1))[None, :]
                s = torch.where(
                    cols <= rows, s, torch.tensor(-1e300, dtype=torch.float64)
                )
            m_new = torch.maximum(m, s.max(-1, keepdim=True).values)
            p = torch.exp(s - m_new)
            den = den * torch.exp(m - m_new) + p.sum(-1, keepdim=True)
            acc = (
                acc * torch.exp(m - m_new)
                + p @ v[..., ks : ks + block_size, :].double()
            )
            m = m_new
        out[..., qs : qs + block_size, :] = acc / den
    return out


def _bias_query_tiles(q, k, v, rel_bias, block_size=64):
    """FlashAttention-2's order: query tiles outside; each tile's bias from a gather of the
    table by the tile's global positions; float64 running sums."""
    K = (rel_bias.size(-1) - 1) // 2
    table = rel_bias.double()
    out = torch.empty(*q.shape[:-1], v.size(-1), dtype=torch.float64)
    for qs in range(0, q.size(-2), block_size):
        qi = q[..., qs : qs + block_size, :].double() / math.sqrt(q.size(-1))
        rows = torch.arange(qs, qs + qi.size(-2))[:, None]
        m = torch.full((*qi.shape[:-1], 1), -1e300, dtype=torch.float64)
        den = torch.zeros_like(m)
        acc = torch.zeros(*qi.shape[:-1], v.size(-1), dtype=torch.float64)
        for ks in range(0, k.size(-2), block_size):
            kj = k[..., ks : ks + block_size, :].double()
            cols = torch.arange(ks, ks + kj.size(-2))[None, :]
            index = (
                torch.clamp(cols - rows, min=-K, max=K) + K
            )  # (tile rows, tile cols)
            bias = torch.stack([table[u][index] for u in range(table.size(0))])
            s = qi @ kj.transpose(-2, -1) + bias
            m_new = torch.maximum(m, s.max(-1, keepdim=True).values)
            p = torch.exp(s - m_new)
            den = den * torch.exp(m - m_new) + p.sum(-1, keepdim=True)
            acc = (
                acc * torch.exp(m - m_new)
                + p @ v[..., ks : ks + block_size, :].double()
            )
            m = m_new
        out[..., qs : qs + block_size, :] = acc / den
    return out


def _window_by_bands(n, window, device=None):
    ones = torch.ones(n, n, dtype=torch.bool, device=device)
    return ones.triu(-window) & ones.tril(window)


def _local_by_mask(q, k, v, window):
    n = q.size(-2)
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    scores = scores.masked_fill(~_window_by_bands(n, window), -1e9)
    return scores.softmax(-1) @ v


def _linear_recurrent(q, k, v, causal=False):
    phi_q, phi_k = F.elu(q.double()) + 1, F.elu(k.double()) + 1
    if not causal:
        return (phi_q @ (phi_k.transpose(-2, -1) @ v.double())) / (
            phi_q @ phi_k.sum(-2)[..., None]
        )
    state = torch.zeros(*q.shape[:-2], q.size(-1), v.size(-1), dtype=torch.float64)
    z = torch.zeros(*q.shape[:-2], q.size(-1), dtype=torch.float64)
    outs = []
    for i in range(q.size(-2)):
        state = state + phi_k[..., i, :, None] * v.double()[..., i, None, :]
        z = z + phi_k[..., i, :]
        outs.append(
            (phi_q[..., i, None, :] @ state)[..., 0, :]
            / (phi_q[..., i, :] * z).sum(-1, keepdim=True)
        )
    return torch.stack(outs, dim=-2)


def _features_log_space(x, projection):
    log_phi = torch.einsum("...nd,md->...nm", x, projection) - 0.5 * x.pow(2).sum(
        -1, keepdim=True
    )
    return (log_phi - 0.5 * math.log(projection.shape[0])).exp()


def _performer_explicit(q, k, v, num_features, projection=None):
    scale = q.size(-1) ** -0.25
    weights = _features_log_space(q * scale, projection) @ _features_log_space(
        k * scale, projection
    ).transpose(-2, -1)
    return weights @ v / weights.sum(-1, keepdim=True)


def _linformer_einsum(q, k, v, proj_k, proj_v):
    keys = torch.einsum("kn,...nd->...kd", proj_k, k)
    values = torch.einsum("kn,...nd->...kd", proj_v, v)
    return (
        torch.softmax(
            torch.einsum("...id,...kd->...ik", q, keys) / q.size(-1) ** 0.5, -1
        )
        @ values
    )


def _gqa_repeat_interleave(q, k, v, mask=None):
    r = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(scores, -1), nan=0.0) @ v


def _kv_by_recomputation(q_t, k_t, v_t, cache=None):
    if cache is not None:
        k_t, v_t = torch.cat([cache[0], k_t], 2), torch.cat([cache[1], v_t], 2)
    s, total = q_t.size(2), k_t.size(2)
    mask = torch.ones(s, total, dtype=torch.bool).tril(total - s)
    return _gqa_repeat_interleave(q_t, k_t, v_t, mask), [k_t, v_t]


class _QueryOuterFlash(torch.autograd.Function):
    """Written from the chapter's text with the loops the other way round: query tiles
    outside in the backward pass too, dK and dV summed across them; float64 inside."""

    @staticmethod
    def forward(ctx, q, k, v, causal, b):
        scale = q.size(-1) ** -0.5
        outs, lses = [], []
        for qs in range(0, q.size(-2), b):
            qt = q[..., qs : qs + b, :].double() * scale
            rows = torch.arange(qs, qs + qt.size(-2))[:, None]
            m = torch.full((*qt.shape[:-1], 1), -1e300, dtype=torch.float64)
            total = torch.zeros_like(m)
            acc = torch.zeros(*qt.shape[:-1], v.size(-1), dtype=torch.float64)
            for ks in range(0, k.size(-2), b):
                s = qt @ k[..., ks : ks + b, :].double().transpose(-2, -1)
                if causal:
                    cols = torch.arange(ks, ks + s.size(-1))[None, :]
                    s = torch.where(cols > rows, -1e300, s)
                m_new = torch.maximum(m, s.max(-1, keepdim=True).values)
                p = torch.exp(s - m_new)
                total = total * torch.exp(m - m_new) + p.sum(-1, keepdim=True)
                acc = acc * torch.exp(m - m_new) + p @ v[..., ks : ks + b, :].double()
                m = m_new
            outs.append(acc / total)
            lses.append((m + total.log()).squeeze(-1))
        out, lse = torch.cat(outs, -2), torch.cat(lses, -1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.b = causal, b
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        d_out, scale = d_out.double(), q.size(-1) ** -0.5
        dq = torch.zeros(q.shape, dtype=torch.float64)
        dk = torch.zeros(k.shape, dtype=torch.float64)
        dv = torch.zeros(v.shape, dtype=torch.float64)
        rowsum = (d_out * out).sum(-1)
        for qs in range(0, q.size(-2), ctx.b):
            sl = slice(qs, qs + ctx.b)
            qt = q[..., sl, :].double()
            s = qt @ k.double().transpose(-2, -1) * scale  # all keys of this query tile
            a = torch.exp(s - lse[..., sl, None])
            if ctx.causal:
                rows = torch.arange(qs, qs + qt.size(-2))[:, None]
                a = torch.where(torch.arange(k.size(-2))[None, :] > rows, 0.0, a)
            da = d_out[..., sl, :] @ v.double().transpose(-2, -1)
            ds = a * (da - rowsum[..., sl, None])
            dq[..., sl, :] = ds @ k.double() * scale
            dk += ds.transpose(-2, -1) @ qt * scale
            dv += a.transpose(-2, -1) @ d_out[..., sl, :]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def _flash_autograd_query_outer(q, k, v, causal=False, block_size=64):
    return _QueryOuterFlash.apply(q, k, v, causal, block_size)


INDEPENDENT_CORRECT_ANSWERS = {
    "flash_attention_autograd": [_flash_autograd_query_outer],
    "FlashAttentionFunction": [_QueryOuterFlash],
    "chunked_attention": [_chunked_split_einsum],
    "flash_attention": [_flash_two_level_tiles],
    "flash_attention_with_bias": [_bias_query_tiles, _bias_materialised],
    "sliding_window_mask": [_window_by_bands],
    "local_attention": [_local_by_mask],
    "linear_attention": [_linear_recurrent],
    "performer_features": [_features_log_space],
    "performer_attention": [_performer_explicit],
    "linformer_attention": [_linformer_einsum],
    "grouped_query_attention": [_gqa_repeat_interleave],
    "kv_cache_step": [_kv_by_recomputation],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, ea, exercise, right, seed)


class _AutogradThroughTiles:
    """FlashAttentionFunction as autograd would run it through chapter 8's forward tiles:
    the right numbers, and a backward that is autograd's, not the student's."""

    @staticmethod
    def apply(q, k, v, causal=False, block_size=64):
        return ea.flash_attention(q, k, v, block_size=block_size, causal=causal)


def test_a_backward_that_autograd_runs_through_the_tiles_loses_its_points():
    """Exercise 11 teaches the backward pass by hand: the hidden tests read what the
    forward saved (exactly q, k, v, out and L), which autograd through the tiles never
    saves; the reference keeps every point."""
    from autograder.grading.judging.spec import load_chapter_tests

    tests = load_chapter_tests("08_efficient_attention")
    selected = [t for t in tests.tests if t.exercise == "FlashAttentionFunction"]
    through = verdicts(
        tests, {"FlashAttentionFunction": _AutogradThroughTiles}, 0, selected
    )
    assert through and not any(v.passed for v in through.values())
    assert all("was not made by its forward" in v.message for v in through.values())
    reference = verdicts(
        tests, {"FlashAttentionFunction": ea.FlashAttentionFunction}, 0, selected
    )
    assert all(v.passed for v in reference.values())

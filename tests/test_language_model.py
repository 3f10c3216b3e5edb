"""Chapter 10, a decoder-only language model: the references against PyTorch's own layers
and CS336's conventions, and the hidden tests against answers written independently of
them (from the chapter's text)."""

import math

import pytest
import torch
import torch.nn.functional as F

from autograder.build import stub_copies
from solutions import language_model as lm
from solutions.positional_encoding import apply_rope
from tests.answers import (
    SEEDS,
    assert_right_answer_passes,
    assert_wrong_answer_fails,
    right_answers,
    wrong_answers,
)

CHAPTER = "10_language_model"


# ------------------------------------------------------- references against PyTorch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rmsnorm_equals_torch_rmsnorm(dtype):
    torch.manual_seed(0)
    x = (torch.randn(3, 7, 16) * 4 + 1).to(dtype)
    ours, theirs = lm.RMSNorm(16), torch.nn.RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16))
        theirs.weight.copy_(ours.weight)
    got = ours(x)
    assert got.dtype == dtype
    expected = theirs(x.float()).to(dtype)  # the same computation, in float32
    torch.testing.assert_close(got, expected)


def test_silu_equals_torch_silu_and_swiglu_follows_the_formula():
    x = torch.linspace(-40, 40, 161)
    torch.testing.assert_close(lm.silu(x), F.silu(x))
    ffn = lm.SwiGLU(8, 20)
    assert {k: tuple(v.shape) for k, v in ffn.state_dict().items()} == {
        "w1.weight": (20, 8),
        "w2.weight": (8, 20),
        "w3.weight": (20, 8),
    }
    y = torch.randn(2, 3, 8)
    expected = F.linear(
        F.silu(F.linear(y, ffn.w1.weight)) * F.linear(y, ffn.w3.weight), ffn.w2.weight
    )
    torch.testing.assert_close(ffn(y), expected)


def test_apply_rope_takes_the_base_theta():
    x, positions = torch.randn(2, 5, 8), torch.arange(5)
    torch.testing.assert_close(
        apply_rope(x, positions, 10000.0), apply_rope(x, positions)
    )
    # theta_i = base^(-2i/d): pair 1 of d = 4 at position 1 turns by 1/sqrt(base)
    e = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    angle = 500.0 ** (-2 / 4)
    torch.testing.assert_close(
        apply_rope(e, torch.tensor([1]), 500.0),
        torch.tensor([[0.0, 0.0, math.cos(angle), math.sin(angle)]]),
    )


@pytest.mark.parametrize("h, g, theta", [(4, 4, 10000.0), (4, 2, 500.0), (6, 1, 1e4)])
def test_causal_self_attention_equals_sdpa_with_rope(h, g, theta):
    torch.manual_seed(0)
    d_head = 4
    attn = lm.CausalSelfAttention(h * d_head, h, g, rope_theta=theta)
    x = torch.randn(2, 9, h * d_head)
    out, cache = attn(x)
    positions = torch.arange(9)
    q = attn.q_proj(x).view(2, 9, h, d_head).transpose(1, 2)
    k = attn.k_proj(x).view(2, 9, g, d_head).transpose(1, 2)
    v = attn.v_proj(x).view(2, 9, g, d_head).transpose(1, 2)
    q, k = apply_rope(q, positions, theta), apply_rope(k, positions, theta)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = attn.output_proj(full.transpose(1, 2).reshape(2, 9, -1))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache[0], k)
    torch.testing.assert_close(cache[1], v)


def test_model_with_caches_equals_full_recomputation_and_generate_returns_its_logits():
    torch.manual_seed(0)
    model = lm.TransformerLM(40, 32, 16, 2, 4, 32, num_kv_heads=2).eval()
    prompt = torch.randint(0, 40, (3, 6))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        tokens, logits = lm.generate(model, prompt, 8, top_p=0.9, generator=g)
        full = model(tokens)
    assert tokens.shape == (3, 14) and logits.shape == (3, 8, 40)
    assert torch.equal(tokens[:, :6], prompt)
    torch.testing.assert_close(logits, full[:, 5:13], rtol=1e-4, atol=1e-5)


def test_tied_weights_share_one_matrix():
    model = lm.TransformerLM(30, 16, 8, 1, 2, 16, tie_weights=True)
    assert model.lm_head.weight is model.token_embeddings.weight
    assert (
        sum(p.numel() for p in model.parameters())
        == sum(p.numel() for p in lm.TransformerLM(30, 16, 8, 1, 2, 16).parameters())
        - 30 * 8
    )


def test_cross_entropy_equals_torch_and_survives_large_logits():
    torch.manual_seed(0)
    logits, targets = torch.randn(4, 6, 11), torch.randint(0, 11, (4, 6))
    torch.testing.assert_close(
        lm.cross_entropy(logits, targets),
        F.cross_entropy(logits.view(-1, 11), targets.view(-1)),
    )
    big = torch.randn(5, 7) * 1e4
    t = torch.randint(0, 7, (5,))
    torch.testing.assert_close(lm.cross_entropy(big, t), F.cross_entropy(big, t))
    assert torch.isfinite(lm.cross_entropy(big, t))


def test_sample_top_p_keeps_the_crossing_token_and_draws_with_multinomial():
    probs = torch.tensor([0.42, 0.27, 0.16, 0.09, 0.06])
    logits = probs.log().expand(3000, 5)
    g = torch.Generator().manual_seed(0)
    for p, kept in ((0.3, 1), (0.6, 2), (0.8, 3), (0.95, 5)):
        counts = torch.bincount(lm.sample(logits, top_p=p, generator=g), minlength=5)
        assert (counts[:kept] > 0).all() and counts[kept:].sum() == 0, (p, counts)
    # no filter: exactly torch.multinomial's draws from the softmax
    x = torch.randn(50, 9)
    assert torch.equal(
        lm.sample(x, generator=torch.Generator().manual_seed(5)),
        torch.multinomial(
            torch.softmax(x, -1), 1, generator=torch.Generator().manual_seed(5)
        )[:, 0],
    )


@pytest.mark.parametrize("q_rank", [None, 6])
def test_latent_attention_equals_sdpa_on_the_joined_heads_and_caches_latents(q_rank):
    """DeepSeek-V2's equations with PyTorch's attention: the reference's output, its cache
    of kv_rank + rope_dim numbers per token, and decoding with it token by token."""
    torch.manual_seed(0)
    B, n, h, d_head, rank, d_rope = 2, 9, 4, 4, 8, 6
    mla = lm.MultiHeadLatentAttention(
        h * d_head, h, rank, d_rope, q_rank, rope_theta=500.0
    )
    x = torch.randn(B, n, h * d_head)
    out, (latent, k_rot) = mla(x)
    pos = torch.arange(n)
    c = torch.nn.RMSNorm(rank, eps=1e-5)
    with torch.no_grad():
        c.weight.copy_(mla.kv_norm.weight)
    expected_latent = c(mla.kv_down(x))
    q_in = x if q_rank is None else mla.q_norm(mla.q_down(x))
    q = torch.cat(
        [
            mla.q_up(q_in).view(B, n, h, d_head).transpose(1, 2),
            apply_rope(
                mla.q_rope(q_in).view(B, n, h, d_rope).transpose(1, 2), pos, 500.0
            ),
        ],
        -1,
    )
    k_shared = apply_rope(mla.k_rope(x), pos, 500.0)  # (B, n, d_rope)
    k = torch.cat(
        [
            mla.k_up(expected_latent).view(B, n, h, d_head).transpose(1, 2),
            k_shared[:, None].expand(B, h, n, d_rope),
        ],
        -1,
    )
    v = mla.v_up(expected_latent).view(B, n, h, d_head).transpose(1, 2)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = mla.output_proj(full.transpose(1, 2).reshape(B, n, -1))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(latent, expected_latent)
    torch.testing.assert_close(k_rot, k_shared)
    assert latent.shape == (B, n, rank) and k_rot.shape == (B, n, d_rope)
    first, cache = mla(x[:, :4])
    steps = [first]
    for t in range(4, n):
        o, cache = mla(x[:, t : t + 1], cache=cache)
        steps.append(o)
    torch.testing.assert_close(torch.cat(steps, 1), out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache[0], latent, rtol=1e-5, atol=1e-6)


def test_the_given_cell_is_derived_from_the_references():
    """Chapter 10's student notebook holds chapters 5 and 8's code as a read-only cell,
    derived by the build from the references, never pasted by hand."""
    assert not stub_copies.stale(CHAPTER)
    text = stub_copies.given(
        ["positional_encoding/apply_rope", "efficient_attention/kv_cache_step"]
    )
    assert "def apply_rope(" in text and "def kv_cache_step(" in text


# ---------------------------------------------------------------- wrong answers


def _rmsnorm_variance(self_cls=lm.RMSNorm):
    class Wrong(self_cls):
        def forward(self, x):
            return x / torch.sqrt(x.var(-1, keepdim=True) + self.eps) * self.weight

    Wrong.__name__ = "_rmsnorm_variance"
    return Wrong


class _RMSNormOverBatch(lm.RMSNorm):
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + self.eps) * self.weight


def _silu_tanh(x):
    return x * torch.tanh(x)


class _SwiGLUAdditiveGate(lm.SwiGLU):
    def forward(self, x):
        return self.w2(lm.silu(self.w1(x)) + self.w3(x))


class _AttentionNoScale(lm.CausalSelfAttention):
    def forward(self, x, positions=None, cache=None):
        B, n, _ = x.shape
        t = 0 if cache is None else cache[0].size(-2)
        positions = torch.arange(t, t + n) if positions is None else positions
        q = self.q_proj(x).view(B, n, self.num_heads, -1).transpose(1, 2)
        k = self.k_proj(x).view(B, n, self.num_kv_heads, -1).transpose(1, 2)
        v = self.v_proj(x).view(B, n, self.num_kv_heads, -1).transpose(1, 2)
        q = apply_rope(q, positions, self.rope_theta) * math.sqrt(self.d_head)
        k = apply_rope(k, positions, self.rope_theta)
        out, cache = lm.kv_cache_step(q, k, v, cache)
        return self.output_proj(out.transpose(1, 2).reshape(B, n, -1)), cache


class _AttentionRepeatNotInterleave(lm.CausalSelfAttention):
    """Expands key/value heads with repeat (0, 1, 0, 1, ...), not repeat_interleave."""

    def forward(self, x, positions=None, cache=None):
        B, n, _ = x.shape
        positions = torch.arange(n) if positions is None else positions
        r = self.num_heads // self.num_kv_heads
        q = self.q_proj(x).view(B, n, self.num_heads, -1).transpose(1, 2)
        k = self.k_proj(x).view(B, n, self.num_kv_heads, -1).transpose(1, 2)
        v = self.v_proj(x).view(B, n, self.num_kv_heads, -1).transpose(1, 2)
        q = apply_rope(q, positions, self.rope_theta)
        k = apply_rope(k, positions, self.rope_theta)
        out, _ = lm.kv_cache_step(q, k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1))
        return self.output_proj(out.transpose(1, 2).reshape(B, n, -1)), (k, v)


def _ce_no_mean(logits, targets):
    m = logits.amax(-1, keepdim=True)
    lse = (m + (logits - m).exp().sum(-1, keepdim=True).log()).squeeze(-1)
    return lse - logits.gather(-1, targets[..., None])[..., 0]


def _sample_top_p_strict(
    logits, temperature=1.0, top_k=None, top_p=None, generator=None
):
    """Keeps tokens while the running sum, including them, is at most p."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, -1)
    if top_p is not None:
        s, order = probs.sort(-1, descending=True)
        kept = s.cumsum(-1) <= top_p
        probs = probs * kept.scatter(-1, order, kept)
    flat = probs.reshape(-1, probs.size(-1))
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def _sample_shifted_removal(
    logits, temperature=1.0, top_k=None, top_p=None, generator=None
):
    """The common shifted mask: remove a token when the running sum before it exceeds p,
    so a token whose higher-ranked tokens hold exactly p stays (one too many)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, -1)
    if top_p is not None:
        s, order = probs.sort(-1, descending=True)
        remove = s.cumsum(-1) > top_p
        remove = torch.cat([torch.zeros_like(remove[..., :1]), remove[..., :-1]], -1)
        probs = probs.masked_fill(remove.scatter(-1, order, remove), 0.0)
    flat = probs.reshape(-1, probs.size(-1))
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


class _RMSNormHalfSquares(lm.RMSNorm):
    """The right formula in the input's own dtype, with rsqrt: float16 squares overflow."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _generate_without_prompt(
    model,
    prompt,
    max_new_tokens,
    temperature=1.0,
    top_k=None,
    top_p=None,
    generator=None,
):
    tokens, logits = lm.generate(
        model, prompt, max_new_tokens, temperature, top_k, top_p, generator
    )
    return tokens[:, prompt.size(1) :], logits


class _MLAOneRotaryQuery(lm.MultiHeadLatentAttention):
    """Shares the rotary query across heads as well (head 0's), not only the rotary key."""

    def forward(self, x, positions=None, cache=None):
        B, n, _ = x.shape
        t = 0 if cache is None else cache[0].shape[1]
        positions = torch.arange(t, t + n) if positions is None else positions
        h, dh, dr = self.num_heads, self.d_head, self.rope_dim
        latent = self.kv_norm(self.kv_down(x))
        k_rot = apply_rope(self.k_rope(x), positions, self.rope_theta)
        if cache is not None:
            latent = torch.cat([cache[0], latent], 1)
            k_rot = torch.cat([cache[1], k_rot], 1)
        q_in = x if self.q_rank is None else self.q_norm(self.q_down(x))
        qc = self.q_up(q_in).view(B, n, h, dh).transpose(1, 2)
        qr = self.q_rope(q_in).view(B, n, h, dr)[:, :, :1].expand(B, n, h, dr)
        qr = apply_rope(qr.transpose(1, 2), positions, self.rope_theta)
        T = latent.shape[1]
        kc = self.k_up(latent).view(B, T, h, dh).transpose(1, 2)
        v = self.v_up(latent).view(B, T, h, dh).transpose(1, 2)
        q = torch.cat([qc, qr], -1)
        k = torch.cat([kc, k_rot[:, None].expand(B, h, T, dr)], -1)
        old = None if cache is None else (k[:, :, :t], v[:, :, :t])
        out, _ = lm.kv_cache_step(q, k[:, :, t:], v[:, :, t:], old)
        return self.output_proj(out.transpose(1, 2).reshape(B, n, -1)), (latent, k_rot)


class _MLACachesRawLatent(lm.MultiHeadLatentAttention):
    """Caches kv_down(x) before the RMSNorm and normalises it at every step: the same
    output, but not the cache the docstring asks for."""

    def forward(self, x, positions=None, cache=None):
        B, n, _ = x.shape
        t = 0 if cache is None else cache[0].shape[1]
        positions = torch.arange(t, t + n) if positions is None else positions
        h, dh, dr = self.num_heads, self.d_head, self.rope_dim
        raw = self.kv_down(x)
        k_rot = apply_rope(self.k_rope(x), positions, self.rope_theta)
        if cache is not None:
            raw = torch.cat([cache[0], raw], 1)
            k_rot = torch.cat([cache[1], k_rot], 1)
        latent, T = self.kv_norm(raw), raw.shape[1]
        q_in = x if self.q_rank is None else self.q_norm(self.q_down(x))
        qc = self.q_up(q_in).view(B, n, h, dh).transpose(1, 2)
        qr = self.q_rope(q_in).view(B, n, h, dr).transpose(1, 2)
        q = torch.cat([qc, apply_rope(qr, positions, self.rope_theta)], -1)
        kc = self.k_up(latent).view(B, T, h, dh).transpose(1, 2)
        v = self.v_up(latent).view(B, T, h, dh).transpose(1, 2)
        k = torch.cat([kc, k_rot[:, None].expand(B, h, T, dr)], -1)
        old = None if cache is None else (k[:, :, :t], v[:, :, :t])
        out, _ = lm.kv_cache_step(q, k[:, :, t:], v[:, :, t:], old)
        return self.output_proj(out.transpose(1, 2).reshape(B, n, -1)), (raw, k_rot)


INDEPENDENT_WRONG_ANSWERS = {
    "RMSNorm": {
        _rmsnorm_variance(): ["lm_rmsnorm"],
        _RMSNormOverBatch: ["lm_rmsnorm"],
        _RMSNormHalfSquares: ["lm_rmsnorm_float16"],
    },
    "silu": [_silu_tanh],
    "SwiGLU": [_SwiGLUAdditiveGate],
    "CausalSelfAttention": {
        _AttentionNoScale: ["lm_attention", "lm_attention_cache"],
        _AttentionRepeatNotInterleave: ["lm_attention"],
    },
    "cross_entropy": [_ce_no_mean],
    "sample": {
        _sample_top_p_strict: ["lm_sample_top_p"],
        _sample_shifted_removal: ["lm_sample_top_p"],
    },
    "generate": [_generate_without_prompt],
    "MultiHeadLatentAttention": [_MLAOneRotaryQuery, _MLACachesRawLatent],
}


@pytest.mark.parametrize(
    "exercise, wrong, test_ids", wrong_answers(INDEPENDENT_WRONG_ANSWERS)
)
def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
    assert_wrong_answer_fails(CHAPTER, lm, exercise, wrong, test_ids)


# ---------------------------------------------------------------- right answers
# Written from the chapter's text and CS336's conventions, not from the reference.


class _RMSNormRsqrt(torch.nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        x32 = x.to(torch.float32)
        scale = torch.rsqrt(torch.mean(x32 * x32, dim=-1, keepdim=True) + self.eps)
        return (self.weight * (x32 * scale)).type_as(x)


class _RMSNormLlama(torch.nn.Module):
    """Llama's order: normalise in float32, cast back to x's dtype, then scale by the
    (float32) weight, which returns float32 for float16 inputs."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def _silu_exp(x):
    return x / (1 + torch.exp(-x))


class _SwiGLUEinsum(torch.nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = torch.nn.Linear(d_model, d_ff, bias=False)
        self.w2 = torch.nn.Linear(d_ff, d_model, bias=False)
        self.w3 = torch.nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x):
        a = torch.einsum("...d,fd->...f", x, self.w1.weight)
        b = torch.einsum("...d,fd->...f", x, self.w3.weight)
        return torch.einsum("...f,df->...d", a * torch.sigmoid(a) * b, self.w2.weight)


def _rotate_complex(x, positions, theta):
    """Rotary positions as complex multiplication: pairs (2i, 2i + 1) as numbers."""
    d = x.size(-1)
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * freqs  # (n, d/2)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return (
        torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles))
        .reshape(x.shape)
        .to(x.dtype)
    )


class _AttentionEinsum(torch.nn.Module):
    """Own rotation, own mask and own expansion of the key/value heads; no cache step."""

    def __init__(
        self,
        d_model,
        num_heads,
        num_kv_heads=None,
        max_seq_len=2048,
        rope_theta=10000.0,
    ):
        super().__init__()
        self.h, self.g = num_heads, num_kv_heads or num_heads
        self.dh, self.theta = d_model // num_heads, rope_theta
        self.q_proj = torch.nn.Linear(d_model, d_model, bias=False)
        self.k_proj = torch.nn.Linear(d_model, self.g * self.dh, bias=False)
        self.v_proj = torch.nn.Linear(d_model, self.g * self.dh, bias=False)
        self.output_proj = torch.nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, positions=None, cache=None):
        B, n, _ = x.shape
        t = 0 if cache is None else cache[0].shape[2]
        if positions is None:
            positions = torch.arange(t, t + n)
        q = self.q_proj(x).reshape(B, n, self.h, self.dh).permute(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, n, self.g, self.dh).permute(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, n, self.g, self.dh).permute(0, 2, 1, 3)
        q, k = (
            _rotate_complex(q, positions, self.theta),
            _rotate_complex(k, positions, self.theta),
        )
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        r = self.h // self.g
        kk, vv = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
        scores = torch.einsum("bhid,bhjd->bhij", q, kk) / math.sqrt(self.dh)
        allowed = torch.arange(t + n)[None, :] <= torch.arange(t, t + n)[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("bhij,bhjd->bhid", scores.softmax(-1), vv)
        return self.output_proj(out.permute(0, 2, 1, 3).reshape(B, n, -1)), (k, v)


class _MLAEinsum(torch.nn.Module):
    """From the chapter's equations: own RMSNorm, own rotation, own mask, einsum scores of
    the two parts added (the same as the dot product of the joined vectors)."""

    def __init__(
        self,
        d_model,
        num_heads,
        kv_rank,
        rope_dim,
        q_rank=None,
        max_seq_len=2048,
        rope_theta=10000.0,
    ):
        super().__init__()

        def linear(i, o):
            return torch.nn.Linear(i, o, bias=False)

        self.h, self.dh, self.dr, self.theta = (
            num_heads,
            d_model // num_heads,
            rope_dim,
            rope_theta,
        )
        self.kv_down, self.kv_norm = linear(d_model, kv_rank), _RMSNormRsqrt(kv_rank)
        self.k_up, self.v_up = linear(kv_rank, d_model), linear(kv_rank, d_model)
        self.k_rope = linear(d_model, rope_dim)
        self.low = q_rank is not None
        q_in = d_model
        if self.low:
            self.q_down, self.q_norm = linear(d_model, q_rank), _RMSNormRsqrt(q_rank)
            q_in = q_rank
        self.q_up, self.q_rope = (
            linear(q_in, d_model),
            linear(q_in, num_heads * rope_dim),
        )
        self.output_proj = linear(d_model, d_model)

    def forward(self, x, positions=None, cache=None):
        B, n, _ = x.shape
        t = 0 if cache is None else cache[0].shape[1]
        if positions is None:
            positions = torch.arange(t, t + n)
        c = self.kv_norm(self.kv_down(x))
        kr = _rotate_complex(self.k_rope(x), positions, self.theta)
        if cache is not None:
            c, kr = torch.cat([cache[0], c], 1), torch.cat([cache[1], kr], 1)
        T = c.shape[1]
        cq = self.q_norm(self.q_down(x)) if self.low else x
        qc = self.q_up(cq).reshape(B, n, self.h, self.dh)
        qr = self.q_rope(cq).reshape(B, n, self.h, self.dr).permute(0, 2, 1, 3)
        qr = _rotate_complex(qr, positions, self.theta)  # (B, h, n, d_R)
        kc = self.k_up(c).reshape(B, T, self.h, self.dh)
        v = self.v_up(c).reshape(B, T, self.h, self.dh)
        scores = torch.einsum("bihd,bjhd->bhij", qc, kc)
        scores = scores + torch.einsum("bhir,bjr->bhij", qr, kr)
        scores = scores / math.sqrt(self.dh + self.dr)
        allowed = torch.arange(T)[None, :] <= torch.arange(t, t + n)[:, None]
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out = torch.einsum("bhij,bjhd->bihd", weights, v).reshape(B, n, -1)
        return self.output_proj(out), (c, kr)


def _ce_logsumexp(logits, targets):
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -logp.gather(-1, targets.unsqueeze(-1)).mean()


def _sample_by_masks(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    if temperature == 0:
        return logits.argmax(dim=-1)
    z = logits / temperature
    if top_k is not None:
        threshold = z.sort(-1, descending=True).values[..., top_k - 1 : top_k]
        z = torch.where(z >= threshold, z, torch.full_like(z, -math.inf))
    p = z.softmax(-1)
    if top_p is not None:
        s, idx = torch.sort(p, dim=-1, descending=True)
        drop = torch.cumsum(s, -1) - s >= top_p
        s = s.masked_fill(drop, 0.0)
        p = torch.zeros_like(p).scatter(-1, idx, s)
        p = p / p.sum(-1, keepdim=True)
    return torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=generator).view(
        p.shape[:-1]
    )


def _sample_ascending(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Hugging Face's nucleus rule: sort the filtered logits ascending and drop the tokens
    whose running probability is at most 1 - p (the largest always stays)."""
    if temperature == 0:
        return logits.argmax(-1)
    z = logits / temperature
    if top_k is not None:
        kth = torch.topk(z, min(top_k, z.size(-1)), -1).values[..., -1:]
        z = z.masked_fill(z < kth, -math.inf)
    if top_p is not None:
        s, idx = torch.sort(z, -1, descending=False)
        remove = s.softmax(-1).cumsum(-1) <= 1 - top_p
        remove[..., -1] = False
        z = z.masked_fill(remove.scatter(-1, idx, remove), -math.inf)
    probs = z.softmax(-1)
    drawn = torch.multinomial(probs.reshape(-1, probs.size(-1)), 1, generator=generator)
    return drawn.view(probs.shape[:-1])


def _generate_by_recomputation(
    model,
    prompt,
    max_new_tokens,
    temperature=1.0,
    top_k=None,
    top_p=None,
    generator=None,
):
    """No cache at all: the whole sequence again at every step (slow, same logits)."""
    tokens, kept = prompt, []
    for _ in range(max_new_tokens):
        last = model(tokens)[:, -1]
        kept.append(last)
        nxt = sample(last, temperature, top_k, top_p, generator)
        tokens = torch.cat([tokens, nxt[:, None]], 1)
    return tokens, torch.stack(kept, 1)


sample = lm.sample  # the notebook's own sample, as _generate_by_recomputation reads it

INDEPENDENT_CORRECT_ANSWERS = {
    "RMSNorm": [_RMSNormRsqrt, _RMSNormLlama],
    "silu": [_silu_exp],
    "SwiGLU": [_SwiGLUEinsum],
    "CausalSelfAttention": [_AttentionEinsum],
    "cross_entropy": [_ce_logsumexp],
    "sample": [_sample_by_masks, _sample_ascending],
    "generate": [_generate_by_recomputation],
    "MultiHeadLatentAttention": [_MLAEinsum],
}


@pytest.mark.parametrize("exercise, right", right_answers(INDEPENDENT_CORRECT_ANSWERS))
@pytest.mark.parametrize("seed", SEEDS)
def test_independent_correct_answers_pass(exercise, right, seed):
    assert_right_answer_passes(CHAPTER, lm, exercise, right, seed)

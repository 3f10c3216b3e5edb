"""Chapter 10, a decoder-only language model: reference implementations.

Conventions follow Stanford CS336's first assignment: bias-free linear maps with weights of
shape ``(out, in)``, pre-norm blocks, rotary positions inside attention. Rotary positions
and the cached attention step are chapter 5's and chapter 8's, imported, not copied.
"""

import torch
from torch import nn

from solutions.efficient_attention import grouped_query_attention, kv_cache_step
from solutions.positional_encoding import apply_rope

__all__ = [
    "apply_rope",
    "grouped_query_attention",
    "kv_cache_step",
    "RMSNorm",
    "silu",
    "SwiGLU",
    "CausalSelfAttention",
    "DecoderBlock",
    "TransformerLM",
    "cross_entropy",
    "sample",
    "generate",
    "MultiHeadLatentAttention",
]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension (Zhang and Sennrich 2019)."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # (d_model,): the gain g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()  # float16 squares overflow past 256 and lose digits: float32
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (x / rms * self.weight).to(dtype)  # (..., d_model)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), also called swish."""
    return x / (1 + torch.exp(-x))  # x * sigmoid(x), sigmoid(x) = 1 / (1 + e^-x)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): a feed-forward layer with a gate (Shazeer 2020)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)  # weight (d_ff, d_model)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)  # weight (d_model, d_ff)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)  # weight (d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the gate silu(w1 x) scales the linear path w3 x entry by entry: (..., d_ff)
        return self.w2(silu(self.w1(x)) * self.w3(x))  # (..., d_model)


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention with rotary positions and grouped key/value heads."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        max_seq_len: int = 2048,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if d_model % num_heads or num_heads % num_kv_heads:
            msg = f"{d_model=} needs {num_heads=} heads in {num_kv_heads=} groups"
            raise ValueError(msg)
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.d_head = d_model // num_heads
        self.max_seq_len, self.rope_theta = max_seq_len, rope_theta
        kv_width = num_kv_heads * self.d_head  # g heads of d_head each
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, kv_width, bias=False)
        self.v_proj = nn.Linear(d_model, kv_width, bias=False)
        self.output_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, n, _ = x.shape
        if positions is None:  # the tokens follow the cached ones
            start = 0 if cache is None else cache[0].size(-2)
            positions = torch.arange(start, start + n, device=x.device)

        def heads(t, h):  # (B, n, h d_head) -> (B, h, n, d_head)
            return t.view(B, n, h, self.d_head).transpose(1, 2)

        q = heads(self.q_proj(x), self.num_heads)  # (B, h, n, d_head)
        k = heads(self.k_proj(x), self.num_kv_heads)  # (B, g, n, d_head)
        v = heads(self.v_proj(x), self.num_kv_heads)  # (B, g, n, d_head)
        # rotate queries and keys (never values) by their own positions, once: the cache
        # keeps keys already rotated, so cached keys are never rotated again
        q = apply_rope(q, positions, self.rope_theta)
        k = apply_rope(k, positions, self.rope_theta)
        out, cache = kv_cache_step(q, k, v, cache)  # (B, h, n, d_head), causal
        out = out.transpose(1, 2).reshape(
            B, n, -1
        )  # (B, n, d_model): heads side by side
        return self.output_proj(out), cache


class DecoderBlock(nn.Module):
    """A pre-norm decoder block: x + attn(ln1(x)), then + ffn(ln2(.))."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        num_kv_heads: int | None = None,
        max_seq_len: int = 2048,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = CausalSelfAttention(
            d_model, num_heads, num_kv_heads, max_seq_len, rope_theta
        )
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attended, cache = self.attn(self.ln1(x), positions, cache)
        x = x + attended  # the residual path carries x itself, never normalised
        return x + self.ffn(self.ln2(x)), cache


class TransformerLM(nn.Module):
    """Token embedding, num_layers decoder blocks, a final RMSNorm and the output layer."""

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        rope_theta: float = 10000.0,
        tie_weights: bool = False,
        num_kv_heads: int | None = None,
    ):
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = nn.Embedding(vocab_size, d_model)  # (vocab, d_model)
        block = (d_model, num_heads, d_ff, num_kv_heads, context_length, rope_theta)
        self.layers = nn.ModuleList(DecoderBlock(*block) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)  # (vocab, d_model)
        if tie_weights:  # one matrix reads tokens in and writes them out
            self.lm_head.weight = self.token_embeddings.weight

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        caches: list | None = None,
    ):
        x = self.token_embeddings(tokens)  # (B, n, d_model)
        new_caches = []
        for i, layer in enumerate(self.layers):
            x, cache = layer(x, positions, None if caches is None else caches[i])
            new_caches.append(cache)
        logits = self.lm_head(self.ln_final(x))  # (B, n, vocab)
        return logits if caches is None else (logits, new_caches)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over positions of -log softmax(logits)[target], from a stable log-sum-exp."""
    m = logits.amax(dim=-1, keepdim=True)  # (..., 1): the largest logit of each row
    # log sum exp(l) = m + log sum exp(l - m): every exponent is <= 0, none overflows
    lse = m.squeeze(-1) + torch.log(torch.exp(logits - m).sum(dim=-1))  # (...)
    target_logit = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (...)
    return (lse - target_logit).mean()


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token id per row of logits (..., vocab): temperature, then top-k, then top-p."""
    if temperature == 0:
        return logits.argmax(dim=-1)  # greedy
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))  # keep >= the k-th
    probs = torch.softmax(logits, dim=-1)  # (..., vocab)
    if top_p is not None:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # a token stays when the tokens ranked above it hold less than p: the token that
        # crosses p stays, the ones after it go (the smallest set holding at least p)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        keep_sorted = before < top_p
        keep = keep_sorted.scatter(-1, order, keep_sorted)  # back to vocabulary order
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    flat = probs.reshape(-1, probs.size(-1))  # (rows, vocab)
    drawn = torch.multinomial(flat, num_samples=1, generator=generator)  # (rows, 1)
    return drawn.reshape(probs.shape[:-1])


def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Extend prompt (B, n) by max_new_tokens tokens with a key-value cache.

    Returns the tokens (B, n + max_new_tokens) and, for each new token, the model's logits
    at the last position (B, max_new_tokens, vocab), before the temperature and filters."""
    caches = [None] * len(model.layers)
    # prefill: the whole prompt in one call fills every layer's cache
    logits, caches = model(prompt, caches=caches)  # (B, n, vocab)
    tokens, step_logits = [prompt], []
    for step in range(max_new_tokens):
        last = logits[:, -1]  # (B, vocab): the prediction for the next position
        step_logits.append(last)
        token = sample(last, temperature, top_k, top_p, generator)  # (B,)
        tokens.append(token[:, None])
        if step + 1 < max_new_tokens:  # the last token needs no forward pass
            # one new token: its keys and values join the cache, at the next position
            logits, caches = model(token[:, None], caches=caches)  # (B, 1, vocab)
    return torch.cat(tokens, dim=1), torch.stack(step_logits, dim=1)


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2): keys and values from one low-rank latent
    per token, and one rotary key shared by all heads; the cache holds only those two."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        kv_rank: int,
        rope_dim: int,
        q_rank: int | None = None,
        max_seq_len: int = 2048,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        if d_model % num_heads or rope_dim % 2:
            msg = f"{d_model=} needs {num_heads=} equal heads and an even {rope_dim=}"
            raise ValueError(msg)
        self.num_heads, self.d_head = num_heads, d_model // num_heads
        self.rope_dim, self.q_rank = rope_dim, q_rank
        self.max_seq_len, self.rope_theta = max_seq_len, rope_theta
        width = num_heads * self.d_head  # h heads of d_head each (= d_model)
        # keys and values: down to the latent c (kv_rank), normalised, up per head
        self.kv_down = nn.Linear(d_model, kv_rank, bias=False)
        self.kv_norm = RMSNorm(kv_rank)
        self.k_up = nn.Linear(kv_rank, width, bias=False)
        self.v_up = nn.Linear(kv_rank, width, bias=False)
        self.k_rope = nn.Linear(d_model, rope_dim, bias=False)  # one key, all heads
        # queries: straight from x, or through their own normalised latent
        q_in = d_model
        if q_rank is not None:
            self.q_down = nn.Linear(d_model, q_rank, bias=False)
            self.q_norm = RMSNorm(q_rank)
            q_in = q_rank
        self.q_up = nn.Linear(q_in, width, bias=False)
        self.q_rope = nn.Linear(q_in, num_heads * rope_dim, bias=False)
        self.output_proj = nn.Linear(width, d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, n, _ = x.shape
        t = 0 if cache is None else cache[0].size(-2)
        if positions is None:  # the tokens follow the cached ones
            positions = torch.arange(t, t + n, device=x.device)
        h, d_head, d_rope = self.num_heads, self.d_head, self.rope_dim

        # what the cache keeps: the latent and the rotated shared key, no head axis
        latent = self.kv_norm(self.kv_down(x))  # (B, n, kv_rank)
        k_rot = apply_rope(self.k_rope(x), positions, self.rope_theta)  # (B, n, d_rope)
        if cache is not None:  # earlier tokens: stored, never rotated again
            latent = torch.cat([cache[0], latent], dim=1)  # (B, t + n, kv_rank)
            k_rot = torch.cat([cache[1], k_rot], dim=1)  # (B, t + n, d_rope)
        total = t + n

        def heads(y, length, d):  # (B, length, h d) -> (B, h, length, d)
            return y.view(B, length, h, d).transpose(1, 2)

        q_in = x if self.q_rank is None else self.q_norm(self.q_down(x))
        q_content = heads(self.q_up(q_in), n, d_head)  # (B, h, n, d_head)
        q_rot = apply_rope(
            heads(self.q_rope(q_in), n, d_rope), positions, self.rope_theta
        )  # (B, h, n, d_rope): each head its own rotary query
        # every head's keys and values, recomputed from the latent of every token
        k_content = heads(self.k_up(latent), total, d_head)  # (B, h, t + n, d_head)
        v = heads(self.v_up(latent), total, d_head)  # (B, h, t + n, d_head)
        k_shared = k_rot[:, None].expand(B, h, total, d_rope)  # the same for all heads
        q = torch.cat([q_content, q_rot], dim=-1)  # (B, h, n, d_head + d_rope)
        k = torch.cat([k_content, k_shared], dim=-1)  # (B, h, t + n, d_head + d_rope)
        # causal over t + n keys, scaled by 1/sqrt(d_head + d_rope): kv_cache_step with
        # the earlier keys as its cache
        earlier = None if cache is None else (k[:, :, :t], v[:, :, :t])
        out, _ = kv_cache_step(
            q, k[:, :, t:], v[:, :, t:], earlier
        )  # (B, h, n, d_head)
        out = out.transpose(1, 2).reshape(B, n, h * d_head)  # heads side by side
        return self.output_proj(out), (latent, k_rot)

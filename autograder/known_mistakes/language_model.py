"""Known mistakes of chapter 10, a decoder-only language model: plausible wrong answers
that every hidden test of their exercise must fail, each with the hint the feedback gives
when a student's outputs match it."""

import math

import torch
import torch.nn.functional as F

from autograder.grading.judging.spec import Mistake
from solutions import language_model as ref
from solutions.efficient_attention import kv_cache_step
from solutions.positional_encoding import apply_rope

_CH = "10_language_model"

# ----------------------------------------------------------------------------- RMSNorm


class _RMSNormNoSqrt(ref.RMSNorm):
    def forward(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _RMSNormCentred(ref.RMSNorm):
    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _RMSNormEpsOutside(ref.RMSNorm):
    def forward(self, x):
        return (
            x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + self.eps) * self.weight
        )


class _RMSNormNoFloat32(ref.RMSNorm):
    """The right formula, computed in the input's dtype: float16 squares overflow."""

    def forward(self, x):
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(x.dtype)


class _RMSNormNoWeight(ref.RMSNorm):
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


# ------------------------------------------------------------------ silu and SwiGLU


def _silu_sigmoid(x):
    return torch.sigmoid(x)


def _silu_gelu(x):
    return F.gelu(x)


def _silu_relu(x):
    return torch.relu(x)


class _SwiGLUGateSwapped(ref.SwiGLU):
    def forward(self, x):
        return self.w2(self.w1(x) * ref.silu(self.w3(x)))


class _SwiGLUNoGate(ref.SwiGLU):
    def forward(self, x):
        return self.w2(ref.silu(self.w1(x)))


class _SwiGLUSigmoidGate(ref.SwiGLU):
    def forward(self, x):
        return self.w2(torch.sigmoid(self.w1(x)) * self.w3(x))


# ------------------------------------------------------------------------- attention


def _attention(
    *,
    rotate_values=False,
    rotate_output=False,
    mask_shift=0,
    rerotate=False,
    restart=False,
    rope=True,
    default_theta=False,
):
    """CausalSelfAttention with one deliberate slip."""

    class Wrong(ref.CausalSelfAttention):
        def forward(self, x, positions=None, cache=None):
            B, n, _ = x.shape
            t = 0 if cache is None else cache[0].size(-2)
            if positions is None:
                positions = torch.arange(n) if restart else torch.arange(t, t + n)
            theta = 10000.0 if default_theta else self.rope_theta

            def heads(y, h):
                return y.view(B, n, h, self.d_head).transpose(1, 2)

            q = heads(self.q_proj(x), self.num_heads)
            k = heads(self.k_proj(x), self.num_kv_heads)
            v = heads(self.v_proj(x), self.num_kv_heads)
            if rope:
                q = apply_rope(q, positions, theta)
            if rope and not rerotate:
                k = apply_rope(k, positions, theta)
            if rotate_values:
                v = apply_rope(v, positions, theta)
            if rerotate:  # rotate every key, cached ones included, by 0 ... t + n - 1
                keys = k if cache is None else torch.cat([cache[0], k], dim=-2)
                values = v if cache is None else torch.cat([cache[1], v], dim=-2)
                keys = apply_rope(keys, torch.arange(t + n), theta)
                old = None if cache is None else (keys[..., :t, :], values[..., :t, :])
                out, new_cache = kv_cache_step(
                    q, keys[..., t:, :], values[..., t:, :], old
                )
            elif mask_shift:
                keys = k if cache is None else torch.cat([cache[0], k], dim=-2)
                values = v if cache is None else torch.cat([cache[1], v], dim=-2)
                r = self.num_heads // self.num_kv_heads
                keys_h = keys.repeat_interleave(r, dim=1)
                values_h = values.repeat_interleave(r, dim=1)
                scores = q @ keys_h.transpose(-2, -1) / math.sqrt(self.d_head)
                i = torch.arange(t, t + n)[:, None]
                j = torch.arange(t + n)[None, :]
                scores = scores.masked_fill(j > i + mask_shift, float("-inf"))
                weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
                out, new_cache = weights @ values_h, (keys, values)
            else:
                out, new_cache = kv_cache_step(q, k, v, cache)
            out = self.output_proj(out.transpose(1, 2).reshape(B, n, -1))
            if rotate_output:
                out = apply_rope(out, positions, theta)
            return out, new_cache

    return Wrong


# ----------------------------------------------------------------------------- block


class _BlockPostNorm(ref.DecoderBlock):
    def forward(self, x, positions=None, cache=None):
        attended, cache = self.attn(x, positions, cache)
        x = self.ln1(x + attended)
        return self.ln2(x + self.ffn(x)), cache


class _BlockNormedResidual(ref.DecoderBlock):
    def forward(self, x, positions=None, cache=None):
        h = self.ln1(x)
        attended, cache = self.attn(h, positions, cache)
        x = h + attended
        h = self.ln2(x)
        return h + self.ffn(h), cache


class _BlockOneNorm(ref.DecoderBlock):
    def forward(self, x, positions=None, cache=None):
        attended, cache = self.attn(self.ln1(x), positions, cache)
        x = x + attended
        return x + self.ffn(self.ln1(x)), cache


# ----------------------------------------------------------------------------- model


class _ModelDefaultTheta(ref.TransformerLM):
    """Builds its blocks without passing rope_theta on: every block rotates with 10000."""

    def __init__(
        self,
        vocab_size,
        context_length,
        d_model,
        num_layers,
        num_heads,
        d_ff,
        rope_theta=10000.0,
        tie_weights=False,
        num_kv_heads=None,
    ):
        super().__init__(
            vocab_size,
            context_length,
            d_model,
            num_layers,
            num_heads,
            d_ff,
            10000.0,
            tie_weights,
            num_kv_heads,
        )


class _ModelNoFinalNorm(ref.TransformerLM):
    def forward(self, tokens, positions=None, caches=None):
        x = self.token_embeddings(tokens)
        new = []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, positions, None if caches is None else caches[i])
            new.append(c)
        logits = self.lm_head(x)
        return logits if caches is None else (logits, new)


class _ModelScaledEmbedding(ref.TransformerLM):
    def forward(self, tokens, positions=None, caches=None):
        x = self.token_embeddings(tokens) * math.sqrt(self.lm_head.in_features)
        new = []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, positions, None if caches is None else caches[i])
            new.append(c)
        logits = self.lm_head(self.ln_final(x))
        return logits if caches is None else (logits, new)


class _ModelFirstLayerOnly(ref.TransformerLM):
    def forward(self, tokens, positions=None, caches=None):
        x = self.token_embeddings(tokens)
        new = []
        for i in range(len(self.layers)):
            x, c = self.layers[0](x, positions, None if caches is None else caches[i])
            new.append(c)
        logits = self.lm_head(self.ln_final(x))
        return logits if caches is None else (logits, new)


# ---------------------------------------------------------------------- cross-entropy


def _ce_naive(logits, targets):
    probs = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    return -torch.log(probs.gather(-1, targets.unsqueeze(-1))).mean()


def _ce_sum(logits, targets):
    m = logits.amax(-1, keepdim=True)
    lse = m.squeeze(-1) + torch.log(torch.exp(logits - m).sum(-1))
    return (lse - logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)).sum()


def _ce_per_position(logits, targets):
    """The right losses, one per position, never averaged into one number."""
    m = logits.amax(-1, keepdim=True)
    lse = m.squeeze(-1) + torch.log(torch.exp(logits - m).sum(-1))
    return lse - logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _ce_no_max_back(logits, targets):
    """Subtracts the maximum but forgets to add it back to the log-sum-exp."""
    m = logits.amax(-1, keepdim=True)
    lse = torch.log(torch.exp(logits - m).sum(-1))
    return (lse - logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)).mean()


# ---------------------------------------------------------------------------- sample


def _sampler(
    *,
    ignore_temperature=False,
    temperature_times=False,
    k_extra=0,
    p_rule="crossing in",
    p_first=False,
    p_before_temperature=False,
    column=False,
):
    def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
        if temperature == 0:
            return logits.argmax(-1)
        if ignore_temperature:
            temperature = 1.0
        nucleus = None
        if p_before_temperature and top_p is not None:
            # the nucleus chosen from softmax(logits), before the temperature reshapes it
            s, order = torch.softmax(logits, -1).sort(-1, descending=True)
            kept = s.cumsum(-1) - s < top_p
            nucleus = kept.scatter(-1, order, kept)
            top_p = None
        logits = logits * temperature if temperature_times else logits / temperature
        if nucleus is not None:
            logits = logits.masked_fill(~nucleus, float("-inf"))
        probs = torch.softmax(logits, -1)

        def keep_top_k(probs):
            k = min(top_k + k_extra, probs.size(-1))
            kth = torch.topk(probs, k, -1).values[..., -1:]
            probs = probs * (probs >= kth)
            return probs / probs.sum(-1, keepdim=True)

        def keep_top_p(probs):
            if p_rule == "unsorted":
                cum = probs.cumsum(-1)
                keep = cum - probs < top_p
            else:
                s, order = probs.sort(-1, descending=True)
                cum = s.cumsum(-1)
                if p_rule == "crossing out":
                    kept = cum <= top_p
                    kept[..., 0] = True
                elif p_rule == "boundary in":  # <= where the rule says <
                    kept = cum - s <= top_p
                elif p_rule == "one more":
                    kept = cum - s < top_p
                    kept = torch.cat([kept[..., :1], kept[..., :-1]], -1) | kept
                else:
                    kept = cum - s < top_p
                keep = kept.scatter(-1, order, kept)
            probs = probs * keep
            return probs / probs.sum(-1, keepdim=True)

        if top_p is not None and p_first:
            probs = keep_top_p(probs)
        if top_k is not None:
            probs = keep_top_k(probs)
        if top_p is not None and not p_first:
            probs = keep_top_p(probs)
        flat = probs.reshape(-1, probs.size(-1))
        drawn = torch.multinomial(flat, 1, generator=generator)  # (rows, 1)
        return drawn if column else drawn.reshape(probs.shape[:-1])

    return sample


# -------------------------------------------------------------------------- generate


def _generator(
    *,
    restart=False,
    first_logits=False,
    refeed=False,
    tempered_logits=False,
    filtered_logits=False,
):
    def generate(
        model,
        prompt,
        max_new_tokens,
        temperature=1.0,
        top_k=None,
        top_p=None,
        generator=None,
    ):
        caches = [None] * len(model.layers)
        logits, caches = model(prompt, caches=caches)
        tokens, kept = prompt, []
        for _ in range(max_new_tokens):
            last = logits[:, 0] if first_logits else logits[:, -1]
            if tempered_logits and temperature != 0:  # the logits divided, as sampled
                kept.append(last / temperature)
            elif filtered_logits and top_k is not None:  # the top-k logits only
                kth = torch.topk(last, min(top_k, last.size(-1)), -1).values[..., -1:]
                kept.append(last.masked_fill(last < kth, float("-inf")))
            else:
                kept.append(last)
            token = ref.sample(last, temperature, top_k, top_p, generator)
            tokens = torch.cat([tokens, token[:, None]], dim=1)
            if restart:
                logits, caches = model(
                    token[:, None], torch.zeros(1, dtype=torch.long), caches
                )
            elif refeed:  # the whole sequence again, on top of the cache
                logits, caches = model(tokens, caches=[None] * len(model.layers))
                logits, caches = model(tokens[:, -1:], caches=caches)
            else:
                logits, caches = model(token[:, None], caches=caches)
        return tokens, torch.stack(kept, 1)

    return generate


def _no_cache_shift():
    """Recomputes without a cache, but reads the logits one position too early."""

    def generate(
        model,
        prompt,
        max_new_tokens,
        temperature=1.0,
        top_k=None,
        top_p=None,
        generator=None,
    ):
        tokens, kept = prompt, []
        for _ in range(max_new_tokens):
            logits = model(tokens)
            last = logits[:, -2] if tokens.size(1) > 1 else logits[:, -1]
            kept.append(last)
            token = ref.sample(last, temperature, top_k, top_p, generator)
            tokens = torch.cat([tokens, token[:, None]], dim=1)
        return tokens, torch.stack(kept, 1)

    return generate


# ---------------------------------------------------------- multi-head latent attention


def _mla(
    *,
    rope_content=False,
    rope_latent=False,
    no_norm=False,
    scale_d_head=False,
    full_cache=False,
    rerotate=False,
    restart=False,
    not_causal=False,
):
    """MultiHeadLatentAttention with one deliberate slip, written out (no kv_cache_step)."""

    class Wrong(ref.MultiHeadLatentAttention):
        def forward(self, x, positions=None, cache=None):
            B, n, _ = x.shape
            t = 0 if cache is None else cache[0].size(-2)
            if positions is None:
                positions = torch.arange(n) if restart else torch.arange(t, t + n)
            h, dh, dr, th = self.num_heads, self.d_head, self.rope_dim, self.rope_theta
            norm = (lambda y: y) if no_norm else self.kv_norm
            latent = norm(self.kv_down(x))
            if rope_latent:
                latent = apply_rope(latent, positions, th)
            k_rot = self.k_rope(x)
            if not rerotate:
                k_rot = apply_rope(k_rot, positions, th)
            if full_cache and cache is not None and cache[0].dim() == 4:
                cache = None  # never reached by a cache the chapter describes
            if cache is not None:
                latent = torch.cat([cache[0], latent], 1)
                k_rot = torch.cat([cache[1], k_rot], 1)
            if rerotate:  # every key rotated by 0 ... t + n - 1, the cached ones again
                k_rot = apply_rope(k_rot, torch.arange(t + n), th)
            T = t + n

            def heads(y, length, d):
                return y.view(B, length, h, d).transpose(1, 2)

            if self.q_rank is None:
                q_in = x
            else:
                q_in = self.q_down(x) if no_norm else self.q_norm(self.q_down(x))
            qc = heads(self.q_up(q_in), n, dh)
            qr = apply_rope(heads(self.q_rope(q_in), n, dr), positions, th)
            kc = heads(self.k_up(latent), T, dh)
            v = heads(self.v_up(latent), T, dh)
            if rope_content:  # the content parts rotated too, at their positions
                qc = apply_rope(qc, positions, th)
                kc = apply_rope(kc, torch.arange(T), th)
            q = torch.cat([qc, qr], -1)
            k = torch.cat([kc, k_rot[:, None].expand(B, h, T, dr)], -1)
            scale = math.sqrt(dh if scale_d_head else dh + dr)
            scores = q @ k.transpose(-2, -1) / scale  # (B, h, n, T)
            if not not_causal:
                i = torch.arange(t, t + n)[:, None]
                scores = scores.masked_fill(torch.arange(T)[None, :] > i, float("-inf"))
            out = torch.softmax(scores, -1) @ v
            out = self.output_proj(out.transpose(1, 2).reshape(B, n, h * dh))
            if full_cache:  # every head's keys and values, as a GQA cache would
                return out, (k, v)
            return out, (latent, k_rot)

    return Wrong


def _m(exercise, name, hint, impl, section):
    return Mistake(exercise, name, hint, impl, f"{_CH}#{section}")


MISTAKES = [
    _m(
        "RMSNorm",
        "no square root",
        "your output scales like 1/x, not like x/|x|: divide by the square root of mean(x^2) + eps, not by the mean itself.",
        _RMSNormNoSqrt,
        "rmsnorm",
    ),
    _m(
        "RMSNorm",
        "mean subtracted",
        "your output looks centred like a LayerNorm: RMSNorm does not subtract the mean, it only divides by the root mean square.",
        _RMSNormCentred,
        "rmsnorm",
    ),
    _m(
        "RMSNorm",
        "not computed in float32",
        "your output is zero, infinite or NaN for float16 inputs with entries above 256: their squares exceed 65504, float16's largest number. Compute the norm on x.float() and cast the result back to x's dtype.",
        _RMSNormNoFloat32,
        "rmsnorm",
    ),
    _m(
        "RMSNorm",
        "eps outside the square root",
        "your output differs for tiny inputs: eps goes inside the square root, sqrt(mean(x^2) + eps).",
        _RMSNormEpsOutside,
        "rmsnorm",
    ),
    _m(
        "RMSNorm",
        "no gain",
        "your output ignores the parameter weight: multiply the normalised x by weight, entry by entry.",
        _RMSNormNoWeight,
        "rmsnorm",
    ),
    _m(
        "silu",
        "sigmoid only",
        "your silu returns sigmoid(x): multiply it by x.",
        _silu_sigmoid,
        "silu-and-swiglu",
    ),
    _m(
        "silu",
        "GELU",
        "your silu looks like GELU, x times the normal CDF: silu uses the logistic sigmoid, x * sigmoid(x).",
        _silu_gelu,
        "silu-and-swiglu",
    ),
    _m(
        "silu",
        "ReLU",
        "your silu is zero for every negative x: silu is smooth, x * sigmoid(x) is slightly negative there.",
        _silu_relu,
        "silu-and-swiglu",
    ),
    _m(
        "SwiGLU",
        "gate on the wrong branch",
        "your silu acts on w3 x: the gate is silu(w1 x), multiplied by the linear branch w3 x.",
        _SwiGLUGateSwapped,
        "silu-and-swiglu",
    ),
    _m(
        "SwiGLU",
        "no gate",
        "your layer ignores w3: SwiGLU multiplies silu(w1 x) by w3 x entry by entry before w2.",
        _SwiGLUNoGate,
        "silu-and-swiglu",
    ),
    _m(
        "SwiGLU",
        "sigmoid gate",
        "your gate is sigmoid(w1 x), as in the original GLU: SwiGLU's gate is silu(w1 x) = w1 x * sigmoid(w1 x).",
        _SwiGLUSigmoidGate,
        "silu-and-swiglu",
    ),
    _m(
        "CausalSelfAttention",
        "rotary on the values",
        "your values are rotated too: rotary positions act on queries and keys only, so that scores depend on offsets; values carry content.",
        _attention(rotate_values=True),
        "causal-self-attention-with-rotary-positions",
    ),
    _m(
        "CausalSelfAttention",
        "rotary after the output projection",
        "your output is rotated after output_proj: rotate the queries and keys of each head, after q_proj and k_proj and before the scores.",
        _attention(rotate_output=True),
        "causal-self-attention-with-rotary-positions",
    ),
    _m(
        "CausalSelfAttention",
        "causal mask off by one",
        "each token sees the next one too: token i may attend to positions 0 ... i only, itself included.",
        _attention(mask_shift=1),
        "causal-self-attention-with-rotary-positions",
    ),
    _m(
        "CausalSelfAttention",
        "no rotary positions",
        "your output does not depend on positions: rotate queries and keys with apply_rope.",
        _attention(rope=False),
        "causal-self-attention-with-rotary-positions",
    ),
    _m(
        "CausalSelfAttention",
        "cache re-rotated",
        "your cached keys are rotated again at every step: keep the keys in the cache already rotated, and rotate only the new ones, by their own positions.",
        _attention(rerotate=True),
        "causal-self-attention-with-rotary-positions",
    ),
    _m(
        "CausalSelfAttention",
        "positions restart at 0",
        "with a cache of t tokens, your new tokens take positions 0, 1, ...: without positions given, they are t, t + 1, ...",
        _attention(restart=True),
        "causal-self-attention-with-rotary-positions",
    ),
    _m(
        "CausalSelfAttention",
        "rope_theta ignored",
        "your rotations do not change with rope_theta: pass it to apply_rope as theta, the base of the frequencies theta_i = rope_theta^(-2i/d_head).",
        _attention(default_theta=True),
        "causal-self-attention-with-rotary-positions",
    ),
    _m(
        "DecoderBlock",
        "post-norm",
        "your block normalises after the residual sum: a pre-norm block normalises each sublayer's input, x + attn(ln1(x)).",
        _BlockPostNorm,
        "the-decoder-block-and-the-model",
    ),
    _m(
        "DecoderBlock",
        "residual from the normalised input",
        "your residual adds ln1(x), not x: the residual path carries x unchanged.",
        _BlockNormedResidual,
        "the-decoder-block-and-the-model",
    ),
    _m(
        "DecoderBlock",
        "one norm for both sublayers",
        "your feed-forward sublayer reuses ln1: each sublayer has its own RMSNorm, ln2 before the feed-forward layer.",
        _BlockOneNorm,
        "the-decoder-block-and-the-model",
    ),
    _m(
        "TransformerLM",
        "no final norm",
        "your logits skip ln_final: apply the final RMSNorm to the last block's output before lm_head.",
        _ModelNoFinalNorm,
        "the-decoder-block-and-the-model",
    ),
    _m(
        "TransformerLM",
        "scaled embeddings",
        "your embeddings are multiplied by sqrt(d_model): this model feeds the embedding rows unscaled.",
        _ModelScaledEmbedding,
        "the-decoder-block-and-the-model",
    ),
    _m(
        "TransformerLM",
        "first block repeated",
        "your model runs the first block num_layers times: each layer in self.layers has its own weights.",
        _ModelFirstLayerOnly,
        "the-decoder-block-and-the-model",
    ),
    _m(
        "TransformerLM",
        "rope_theta not passed on",
        "your blocks rotate with the default base whatever rope_theta is: pass rope_theta on to every block's CausalSelfAttention.",
        _ModelDefaultTheta,
        "the-decoder-block-and-the-model",
    ),
    _m(
        "cross_entropy",
        "naive softmax",
        "your loss is NaN or infinite at large logits: subtract each row's maximum before exp, as a stable log-sum-exp does.",
        _ce_naive,
        "the-loss-cross-entropy-and-perplexity",
    ),
    _m(
        "cross_entropy",
        "sum, not mean",
        "your loss grows with the number of positions: average over positions.",
        _ce_sum,
        "the-loss-cross-entropy-and-perplexity",
    ),
    _m(
        "cross_entropy",
        "one loss per position",
        "your loss has one value per position: return their mean, a scalar tensor.",
        _ce_per_position,
        "the-loss-cross-entropy-and-perplexity",
    ),
    _m(
        "cross_entropy",
        "maximum not added back",
        "your log-sum-exp is short by the maximum: log sum exp(l) = m + log sum exp(l - m).",
        _ce_no_max_back,
        "the-loss-cross-entropy-and-perplexity",
    ),
    _m(
        "sample",
        "temperature ignored",
        "your draws do not change with the temperature: divide the logits by it before the softmax (0 means greedy).",
        _sampler(ignore_temperature=True),
        "sampling",
    ),
    _m(
        "sample",
        "temperature multiplied",
        "your temperature sharpens when it should flatten: divide the logits by the temperature.",
        _sampler(temperature_times=True),
        "sampling",
    ),
    _m(
        "sample",
        "top-k keeps one more",
        "your top-k keeps k + 1 tokens: keep the k largest logits only.",
        _sampler(k_extra=1),
        "sampling",
    ),
    _m(
        "sample",
        "draws kept as (rows, 1)",
        "your tokens have an extra dimension: torch.multinomial(probs, 1) returns (rows, 1); return one id per row of logits, shape logits.shape[:-1].",
        _sampler(column=True),
        "sampling",
    ),
    _m(
        "sample",
        "top-p drops the crossing token",
        "your top-p set holds less than p: keep the token whose probability carries the running sum past p.",
        _sampler(p_rule="crossing out"),
        "sampling",
    ),
    _m(
        "sample",
        "top-p keeps one past the crossing",
        "your top-p set keeps a token after the one that crosses p: stop right after the crossing token.",
        _sampler(p_rule="one more"),
        "sampling",
    ),
    _m(
        "sample",
        "top-p keeps the token at exactly p",
        "your top-p keeps a token whose higher-ranked tokens already hold exactly p: a token stays only while the tokens ranked above it hold less than p in total.",
        _sampler(p_rule="boundary in"),
        "sampling",
    ),
    _m(
        "sample",
        "top-p before the temperature",
        "your nucleus is chosen before the temperature reshapes the probabilities: divide the logits by the temperature first, then apply top-k, the softmax and top-p, in that order.",
        _sampler(p_before_temperature=True),
        "sampling",
    ),
    _m(
        "sample",
        "top-p in vocabulary order",
        "your top-p sums probabilities in vocabulary order: sort them from the largest down first.",
        _sampler(p_rule="unsorted"),
        "sampling",
    ),
    _m(
        "sample",
        "top-p before top-k",
        "your filters run in the other order: temperature, then top-k, then top-p on the renormalised top-k probabilities.",
        _sampler(p_first=True),
        "sampling",
    ),
    _m(
        "generate",
        "positions restart at 0",
        "every new token is fed at position 0: with a cache, each new token takes the next position.",
        _generator(restart=True),
        "generating-with-a-key-value-cache",
    ),
    _m(
        "generate",
        "logits of the first position",
        "you sample from the prompt's first position: the next token comes from the logits of the last position.",
        _generator(first_logits=True),
        "generating-with-a-key-value-cache",
    ),
    _m(
        "generate",
        "sequence fed twice",
        "your cache holds the sequence twice: feed the prompt once, then only each new token.",
        _generator(refeed=True),
        "generating-with-a-key-value-cache",
    ),
    _m(
        "generate",
        "logits divided by the temperature",
        "your logits are divided by the temperature: return the model's logits as it gave them; sample divides its own copy.",
        _generator(tempered_logits=True),
        "generating-with-a-key-value-cache",
    ),
    _m(
        "generate",
        "filtered logits",
        "your logits are -inf outside the top-k tokens: return the model's logits as it gave them, before any filter; the filters only decide what sample draws.",
        _generator(filtered_logits=True),
        "generating-with-a-key-value-cache",
    ),
    _m(
        "generate",
        "logits one position early",
        "you sample from the second-to-last position: the next token comes from the last position's logits.",
        _no_cache_shift(),
        "generating-with-a-key-value-cache",
    ),
    _m(
        "MultiHeadLatentAttention",
        "rotary on the compressed keys",
        "your content queries and keys are rotated too: only the decoupled parts (q_rope's queries and the shared k_rope key) are rotated; keys up-projected from the latent stay unrotated, so that k_up can be folded into the queries.",
        _mla(rope_content=True),
        "multi-head-latent-attention",
    ),
    _m(
        "MultiHeadLatentAttention",
        "rotary on the latent",
        "your latent is rotated by its position: the latent is cached and up-projected as it is; positions enter through the shared rotary key only.",
        _mla(rope_latent=True),
        "multi-head-latent-attention",
    ),
    _m(
        "MultiHeadLatentAttention",
        "latent not normalised",
        "your latents skip their RMSNorm: normalise kv_down(x) with kv_norm (and q_down(x) with q_norm) before the up-projections.",
        _mla(no_norm=True),
        "multi-head-latent-attention",
    ),
    _m(
        "MultiHeadLatentAttention",
        "scaled by sqrt(d_head) only",
        "your scores are divided by sqrt(d_head): each query and key has d_head + rope_dim entries, so divide by sqrt(d_head + rope_dim).",
        _mla(scale_d_head=True),
        "multi-head-latent-attention",
    ),
    _m(
        "MultiHeadLatentAttention",
        "cache holds full keys and values",
        "your cache holds every head's keys and values: cache the normalised latent (B, t, kv_rank) and the rotated shared key (B, t, rope_dim) only, and recompute keys and values from them.",
        _mla(full_cache=True),
        "multi-head-latent-attention",
    ),
    _m(
        "MultiHeadLatentAttention",
        "cached rotary keys rotated again",
        "your cached rotary keys are rotated again at every step: keep them in the cache already rotated, and rotate only the new ones, by their own positions.",
        _mla(rerotate=True),
        "multi-head-latent-attention",
    ),
    _m(
        "MultiHeadLatentAttention",
        "positions restart at 0",
        "with a cache of t tokens, your new tokens take positions 0, 1, ...: without positions given, they are t, t + 1, ...",
        _mla(restart=True),
        "multi-head-latent-attention",
    ),
    _m(
        "MultiHeadLatentAttention",
        "not causal",
        "each token sees the tokens after it: token i may attend to positions 0 ... i only, itself included.",
        _mla(not_causal=True),
        "multi-head-latent-attention",
    ),
]

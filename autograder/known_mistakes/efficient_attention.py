"""Known mistakes of efficient attention: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import math

import torch
import torch.nn.functional as F

from autograder.grading.judging.spec import Mistake
from autograder.known_mistakes._flash_slips import SLIPS, wrong_flash_function
from solutions import efficient_attention as ref


def _attention(q, k, v, scale=None, softmax_dim=-1):
    """Softmax attention with the scale and the softmax axis as parameters."""
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=softmax_dim) @ v


def _chunked_unscaled(q, k, v, chunk_size):
    return torch.cat(
        [
            _attention(q[..., s : s + chunk_size, :], k, v, scale=1.0)
            for s in range(0, q.size(-2), chunk_size)
        ],
        dim=-2,
    )


def _chunked_softmax_over_queries(q, k, v, chunk_size):
    return torch.cat(
        [
            _attention(q[..., s : s + chunk_size, :], k, v, softmax_dim=-2)
            for s in range(0, q.size(-2), chunk_size)
        ],
        dim=-2,
    )


def _chunked_drops_last(q, k, v, chunk_size):
    stop = q.size(-2) - q.size(-2) % chunk_size
    if stop == 0:
        return _attention(q[..., :0, :], k, v)
    return torch.cat(
        [
            _attention(q[..., s : s + chunk_size, :], k, v)
            for s in range(0, stop, chunk_size)
        ],
        dim=-2,
    )


def _chunked_keys_separately(q, k, v, chunk_size):
    """Chunks the keys instead and averages the per-chunk softmax outputs."""
    parts = [
        _attention(q, k[..., s : s + chunk_size, :], v[..., s : s + chunk_size, :])
        for s in range(0, k.size(-2), chunk_size)
    ]
    return torch.stack(parts).mean(0)


def _wrong_flash(
    *,
    rescale_acc=True,
    rescale_l=True,
    update_max=True,
    scale=True,
    normalise=True,
    diagonal="keep",
    honour_causal=True,
):
    """flash_attention with one deliberate slip; ``diagonal``: "keep" (right), "hide" (the
    causal mask excludes j == i) or "skip" (the block holding the diagonal is left out)."""

    def flash(q, k, v, block_size=64, causal=False):
        causal = causal and honour_causal
        n_q, n_k = q.size(-2), k.size(-2)
        if scale:
            q = q / math.sqrt(q.size(-1))
        m = q.new_full((*q.shape[:-1], 1), float("-inf"))
        denom = q.new_zeros((*q.shape[:-1], 1))
        acc = q.new_zeros((*q.shape[:-1], v.size(-1)))
        for start in range(0, n_k, block_size):
            end = min(start + block_size, n_k)
            s = q @ k[..., start:end, :].transpose(-2, -1)
            if causal:
                i = torch.arange(n_q)[:, None]
                j = torch.arange(start, end)[None, :]
                hidden = {
                    "keep": j > i,
                    "hide": j >= i,
                    "skip": j > i - i % block_size - 1,
                }
                s = s.masked_fill(hidden[diagonal], float("-inf"))
            block_max = s.amax(dim=-1, keepdim=True)
            if update_max:
                m_new = torch.maximum(m, block_max)
            else:  # the maximum of the first block, kept for good
                m_new = torch.where(torch.isinf(m), block_max, m)
            p = torch.exp(s - m_new).nan_to_num(0.0)
            alpha = torch.exp(m - m_new).nan_to_num(0.0)
            denom = (alpha if rescale_l else 1.0) * denom + p.sum(dim=-1, keepdim=True)
            acc = (alpha if rescale_acc else 1.0) * acc + p @ v[..., start:end, :]
            m = m_new
        return acc / denom if normalise else acc

    return flash


def _wrong_flash_bias(
    *, sign=1.0, offset="global", after_max=False, scale_bias=False, direction="j - i"
):
    """flash_attention_with_bias with one deliberate slip: ``sign`` -1 subtracts the bias;
    ``offset`` "local" reads the tile's keys as positions 0 ... b - 1; ``after_max`` takes
    the running maximum of the unbiased scores; ``scale_bias`` divides the bias by sqrt(d)
    too; ``direction`` "i - j" reads the table by the opposite offset."""

    def flash(q, k, v, rel_bias, block_size=64):
        n_q, n_k, d = q.size(-2), k.size(-2), q.size(-1)
        K = (rel_bias.size(-1) - 1) // 2
        m = q.new_full((*q.shape[:-1], 1), float("-inf"))
        denom = q.new_zeros((*q.shape[:-1], 1))
        acc = q.new_zeros((*q.shape[:-1], v.size(-1)))
        i = torch.arange(n_q)[:, None]
        for start in range(0, n_k, block_size):
            end = min(start + block_size, n_k)
            j = torch.arange(start, end)[None, :]
            if offset == "local":
                j = j - start
            rel = j - i if direction == "j - i" else i - j
            bias = sign * rel_bias[:, rel.clamp(-K, K) + K]
            raw = q @ k[..., start:end, :].transpose(-2, -1)
            s = (raw + bias) / math.sqrt(d) if scale_bias else raw / math.sqrt(d) + bias
            ruler = raw / math.sqrt(d) if after_max else s
            m_new = torch.maximum(m, ruler.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            denom = alpha * denom + p.sum(dim=-1, keepdim=True)
            acc = alpha * acc + p @ v[..., start:end, :]
            m = m_new
        return acc / denom

    return flash


def _window_mask_strict(n, window, device=None):
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() < window


def _window_mask_one_sided(n, window, device=None):
    i = torch.arange(n, device=device)
    distance = i[:, None] - i[None, :]
    return (distance >= 0) & (distance <= window)


def _window_mask_float(n, window, device=None):
    return ref.sliding_window_mask(n, window, device).float()


def _window_mask_total_width(n, window, device=None):
    """Reads `window` as the total width of the band, window // 2 on each side."""
    return ref.sliding_window_mask(n, window // 2, device)


def _masked_attention(q, k, v, mask, scale=None):
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _local_window_off_by_one(q, k, v, window):
    return _masked_attention(q, k, v, _window_mask_strict(q.size(-2), window))


def _local_unscaled(q, k, v, window):
    return _masked_attention(
        q, k, v, ref.sliding_window_mask(q.size(-2), window), scale=1.0
    )


def _local_one_sided(q, k, v, window):
    return _masked_attention(q, k, v, _window_mask_one_sided(q.size(-2), window))


def _local_padding_attended(q, k, v, window):
    """The banded computation without hiding the zero padding slots."""
    n, width = q.size(-2), 2 * window + 1
    k_pad = F.pad(k, (0, 0, window, window))
    v_pad = F.pad(v, (0, 0, window, window))
    scores = torch.stack(
        [(q * k_pad[..., c : c + n, :]).sum(-1) for c in range(width)], dim=-1
    ) / math.sqrt(q.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return sum(weights[..., c : c + 1] * v_pad[..., c : c + n, :] for c in range(width))


def _wrong_linear(*, feature="elu+1", normalise=True, prefix="inclusive", scale=False):
    def linear(q, k, v, causal=False):
        if scale:
            q = q / math.sqrt(q.size(-1))
        phi = {
            "elu+1": lambda x: F.elu(x) + 1,
            "elu": F.elu,
            "relu": F.relu,
        }[feature]
        weights = phi(q) @ phi(k).transpose(-2, -1)
        if causal and prefix != "ignored":
            offset = 0 if prefix == "inclusive" else -1
            weights = weights.tril(offset)
        if not normalise:
            return weights @ v
        return (weights / weights.sum(-1, keepdim=True)) @ v

    return linear


def _features_no_norm_term(x, projection):
    return torch.exp(x @ projection.T) / math.sqrt(projection.size(0))


def _features_no_sqrt_m(x, projection):
    return torch.exp(x @ projection.T - (x * x).sum(-1, keepdim=True) / 2)


def _features_full_norm(x, projection):
    return torch.exp(x @ projection.T - (x * x).sum(-1, keepdim=True)) / math.sqrt(
        projection.size(0)
    )


def _features_scaled_inside(x, projection):
    return ref.performer_features(x / x.size(-1) ** 0.25, projection)


def _wrong_performer(*, scale="quarter", normalise=True, features=None):
    features = features or ref.performer_features

    def performer(q, k, v, num_features, projection=None):
        d = q.size(-1)
        if projection is None:
            projection = torch.randn(num_features, d)
        factor = {"quarter": d**-0.25, "none": 1.0, "half": d**-0.5}[scale]
        phi_q = features(q * factor, projection)
        phi_k = features(k * factor, projection)
        out = phi_q @ (phi_k.transpose(-2, -1) @ v)
        if not normalise:
            return out
        return out / (phi_q @ phi_k.sum(-2).unsqueeze(-1))

    return performer


def _linformer_projects_queries(q, k, v, proj_k, proj_v):
    if proj_k.size(-1) != q.size(-2):
        return _attention(q, k, v)  # the shapes do not allow it: plain attention
    return _attention(proj_k @ q, k, v)


def _linformer_swapped(q, k, v, proj_k, proj_v):
    return _attention(q, proj_v @ k, proj_k @ v)


def _linformer_unscaled(q, k, v, proj_k, proj_v):
    return _attention(q, proj_k @ k, proj_v @ v, scale=1.0)


def _linformer_scaled_by_k(q, k, v, proj_k, proj_v):
    return _attention(q, proj_k @ k, proj_v @ v, scale=1 / math.sqrt(proj_k.size(0)))


def _wrong_gqa(*, expand="interleave", scale=True, use_mask=True, softmax_dim=-1):
    def gqa(q, k, v, mask=None):
        h, g = q.size(-3), k.size(-3)
        if expand == "interleave":
            k, v = k.repeat_interleave(h // g, -3), v.repeat_interleave(h // g, -3)
        elif expand == "repeat":
            k, v = k.repeat(1, h // g, 1, 1), v.repeat(1, h // g, 1, 1)
        else:  # "average": one shared head, the mean of the key/value heads
            k, v = k.mean(-3, keepdim=True), v.mean(-3, keepdim=True)
        scores = q @ k.transpose(-2, -1) / (math.sqrt(q.size(-1)) if scale else 1.0)
        if mask is not None and use_mask:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=softmax_dim)
        if mask is not None and use_mask:
            weights = weights.masked_fill(~mask, 0.0)
        return weights @ v

    return gqa


def _wrong_kv(*, update=True, include_new=True, order="append", causal=True, gqa=None):
    attend = gqa or ref.grouped_query_attention

    def step(q_t, k_t, v_t, cache=None):
        if cache is None:
            keys, values = k_t, v_t
            old = (k_t[..., :0, :], v_t[..., :0, :])
        else:
            old = tuple(cache)
            pair = [
                (c, n) if order == "append" else (n, c)
                for c, n in zip(old, (k_t, v_t), strict=True)
            ]
            keys, values = (torch.cat(p, dim=-2) for p in pair)
        s, total = q_t.size(-2), keys.size(-2)
        if include_new:
            position = torch.arange(total - s, total)[:, None]
            mask = torch.arange(total)[None, :] <= position if causal else None
            out = attend(q_t, keys, values, mask)
        else:
            out = attend(q_t, *old)
        new_cache = (keys, values) if update else cache
        return out, new_cache

    return step


def _wrong_flash_autograd(**slips):
    """flash_attention_autograd through an autograd function with one slip."""
    function = wrong_flash_function(**slips)

    def flash(q, k, v, causal=False, block_size=64):
        return function.apply(q, k, v, causal, block_size)

    return flash


MISTAKES = [
    Mistake(
        "chunked_attention",
        "unscaled",
        "your scores look unscaled: did you divide q k^T by sqrt(d)?",
        _chunked_unscaled,
    ),
    Mistake(
        "chunked_attention",
        "softmax over queries",
        "your weights look normalised over the queries of a chunk: take the softmax over "
        "the keys (dim=-1), so that each query's row sums to 1.",
        _chunked_softmax_over_queries,
    ),
    Mistake(
        "chunked_attention",
        "last chunk dropped",
        "your output misses the last queries: when chunk_size does not divide n_q, is the "
        "last, shorter chunk computed too (range(0, n_q, chunk_size))?",
        _chunked_drops_last,
    ),
    Mistake(
        "chunked_attention",
        "keys chunked separately",
        "your output looks like an average of separate softmaxes over chunks of keys: chunk "
        "the queries, and let every chunk attend to all the keys at once.",
        _chunked_keys_separately,
    ),
    Mistake(
        "flash_attention",
        "accumulator not rescaled",
        "when the running maximum grows, is the running output o multiplied by "
        "exp(m_old - m_new) before the new block is added?",
        _wrong_flash(rescale_acc=False),
    ),
    Mistake(
        "flash_attention",
        "denominator not rescaled",
        "when the running maximum grows, is the running denominator l multiplied by "
        "exp(m_old - m_new) before the new block's sum is added?",
        _wrong_flash(rescale_l=False),
    ),
    Mistake(
        "flash_attention",
        "running max not updated",
        "your output breaks down on large logits: is the running maximum updated to "
        "max(m, rowmax(scores)) at every block, not only at the first?",
        _wrong_flash(update_max=False),
    ),
    Mistake(
        "flash_attention",
        "unscaled",
        "your scores look unscaled: did you divide q k^T by sqrt(d)?",
        _wrong_flash(scale=False),
    ),
    Mistake(
        "flash_attention",
        "not normalised",
        "your output looks unnormalised: divide the running output o by the running "
        "denominator l at the end.",
        _wrong_flash(normalise=False),
    ),
    Mistake(
        "flash_attention",
        "causal diagonal excluded",
        "your causal mask hides the diagonal: query i may attend to key j when j <= i, "
        "itself included (mask only j > i).",
        _wrong_flash(diagonal="hide"),
    ),
    Mistake(
        "flash_attention",
        "causal diagonal block skipped",
        "your causal version seems to skip the block that holds the diagonal: a key block "
        "starting at s must still be used by the queries i >= s.",
        _wrong_flash(diagonal="skip"),
    ),
    Mistake(
        "flash_attention",
        "causal ignored",
        "with causal=True your output still looks at future keys: hide key j from query i "
        "when j > i.",
        _wrong_flash(honour_causal=False),
    ),
    Mistake(
        "flash_attention_with_bias",
        "bias subtracted",
        "your bias seems to enter with the wrong sign: add rel_bias[u, clip(j - i, K) + K] "
        "to the scaled score q_i . k_j / sqrt(d), do not subtract it.",
        _wrong_flash_bias(sign=-1.0),
    ),
    Mistake(
        "flash_attention_with_bias",
        "tile offset ignored",
        "your bias looks right for the first block of keys only: key j of the block "
        "starting at `start` is at position start + j, so the offset is (start + j) - i.",
        _wrong_flash_bias(offset="local"),
    ),
    Mistake(
        "flash_attention_with_bias",
        "running max without the bias",
        "your output breaks down on large biases: take the running maximum of the biased "
        "scores (add the bias to the tile before its row maximum), not of q k^T / sqrt(d).",
        _wrong_flash_bias(after_max=True),
    ),
    Mistake(
        "flash_attention_with_bias",
        "bias scaled by 1/sqrt(d)",
        "your bias looks divided by sqrt(d): only q k^T is scaled; add the bias to the "
        "scaled score as it is.",
        _wrong_flash_bias(scale_bias=True),
    ),
    Mistake(
        "flash_attention_with_bias",
        "offset i - j",
        "your bias looks read by the offset i - j: the table's row for query i and key j "
        "is clip(j - i, K) + K (positive when the key comes after the query).",
        _wrong_flash_bias(direction="i - j"),
    ),
    Mistake(
        "sliding_window_mask",
        "window off by one",
        "your window looks one too narrow: query i may attend to key j when |i - j| <= "
        "window (not < window).",
        _window_mask_strict,
    ),
    Mistake(
        "sliding_window_mask",
        "one-sided window",
        "your window only looks back: the mask is symmetric, |i - j| <= window on both sides.",
        _window_mask_one_sided,
    ),
    Mistake(
        "sliding_window_mask",
        "not bool",
        "your mask is not a bool tensor: return dtype torch.bool (True = may attend).",
        _window_mask_float,
    ),
    Mistake(
        "sliding_window_mask",
        "window as total width",
        "your band looks half as wide: `window` is the distance on each side, so each row "
        "has up to 2 window + 1 True entries.",
        _window_mask_total_width,
    ),
    Mistake(
        "local_attention",
        "window off by one",
        "your window looks one too narrow: query i sees keys j with |i - j| <= window, "
        "offsets -window ... window included.",
        _local_window_off_by_one,
    ),
    Mistake(
        "local_attention",
        "unscaled",
        "your scores look unscaled: did you divide by sqrt(d)?",
        _local_unscaled,
    ),
    Mistake(
        "local_attention",
        "one-sided window",
        "your window only looks back: local attention here sees window keys on each side.",
        _local_one_sided,
    ),
    Mistake(
        "local_attention",
        "padding attended",
        "your outputs differ near the ends of the sequence: are the padding slots (keys "
        "before 0 or after n - 1) hidden before the softmax?",
        _local_padding_attended,
    ),
    Mistake(
        "linear_attention",
        "elu instead of elu + 1",
        "your feature map looks like elu(x): use elu(x) + 1, which is positive everywhere.",
        _wrong_linear(feature="elu"),
    ),
    Mistake(
        "linear_attention",
        "relu feature map",
        "your feature map looks like relu(x): use elu(x) + 1.",
        _wrong_linear(feature="relu"),
    ),
    Mistake(
        "linear_attention",
        "not normalised",
        "your output looks unnormalised: divide phi(q_i)^T S by phi(q_i)^T z, with "
        "z = sum_j phi(k_j).",
        _wrong_linear(normalise=False),
    ),
    Mistake(
        "linear_attention",
        "scaled by 1/sqrt(d)",
        "your queries look scaled by 1/sqrt(d): linear attention applies phi to q and k as "
        "they are.",
        _wrong_linear(scale=True),
    ),
    Mistake(
        "linear_attention",
        "exclusive prefix sums",
        "with causal=True your sums seem to stop before the current token: the prefix sums "
        "run over j <= i, token i included (an inclusive cumsum).",
        _wrong_linear(prefix="exclusive"),
    ),
    Mistake(
        "linear_attention",
        "causal ignored",
        "with causal=True your output still uses future keys: use prefix sums over j <= i.",
        _wrong_linear(prefix="ignored"),
    ),
    Mistake(
        "performer_features",
        "no norm term",
        "your features miss the factor exp(-|x|^2 / 2).",
        _features_no_norm_term,
    ),
    Mistake(
        "performer_features",
        "no 1/sqrt(m)",
        "your features look too large by sqrt(m): divide by the square root of the number "
        "of features.",
        _features_no_sqrt_m,
    ),
    Mistake(
        "performer_features",
        "norm term not halved",
        "your features look like exp(w . x - |x|^2): the norm term is |x|^2 / 2.",
        _features_full_norm,
    ),
    Mistake(
        "performer_features",
        "scaled inside",
        "your features look scaled by d^(-1/4) inside: performer_features applies no "
        "scaling; performer_attention scales q and k before calling it.",
        _features_scaled_inside,
    ),
    Mistake(
        "performer_attention",
        "unscaled",
        "your queries and keys look unscaled: divide each by d^(1/4) before the features.",
        _wrong_performer(scale="none"),
    ),
    Mistake(
        "performer_attention",
        "scaled by 1/sqrt(d) twice",
        "your queries and keys look divided by sqrt(d) each: divide each by d^(1/4), so that "
        "their product carries 1/sqrt(d) once.",
        _wrong_performer(scale="half"),
    ),
    Mistake(
        "performer_attention",
        "not normalised",
        "your output looks unnormalised: divide by phi(q_i) . sum_j phi(k_j).",
        _wrong_performer(normalise=False),
    ),
    Mistake(
        "performer_attention",
        "features without the norm term",
        "your features seem to miss exp(-|x|^2 / 2): use performer_features.",
        _wrong_performer(features=_features_no_norm_term),
    ),
    Mistake(
        "linformer_attention",
        "queries projected",
        "your output has the projected length: project the keys (proj_k) and the values "
        "(proj_v), not the queries; every query keeps its own output.",
        _linformer_projects_queries,
    ),
    Mistake(
        "linformer_attention",
        "E and F swapped",
        "your projections look swapped: proj_k (the paper's E) projects the keys and "
        "proj_v (F) the values.",
        _linformer_swapped,
    ),
    Mistake(
        "linformer_attention",
        "unscaled",
        "your scores look unscaled: did you divide by sqrt(d)?",
        _linformer_unscaled,
    ),
    Mistake(
        "linformer_attention",
        "scaled by sqrt(k)",
        "your scores look divided by sqrt(k), the projected length: the scale is 1/sqrt(d), "
        "with d the width of the queries and keys.",
        _linformer_scaled_by_k,
    ),
    Mistake(
        "grouped_query_attention",
        "repeat instead of repeat_interleave",
        "query heads seem to use key/value head j % g: head j must use j // (h // g) "
        "(repeat_interleave, not repeat).",
        _wrong_gqa(expand="repeat"),
    ),
    Mistake(
        "grouped_query_attention",
        "unscaled",
        "your scores look unscaled: did you divide by sqrt(d)?",
        _wrong_gqa(scale=False),
    ),
    Mistake(
        "grouped_query_attention",
        "key/value heads averaged",
        "your output looks as if all key/value heads were averaged into one: each group of "
        "h // g query heads has its own key/value head.",
        _wrong_gqa(expand="average"),
    ),
    Mistake(
        "grouped_query_attention",
        "mask ignored",
        "your output ignores the mask: hide the keys where the mask is False.",
        _wrong_gqa(use_mask=False),
    ),
    Mistake(
        "grouped_query_attention",
        "softmax over queries",
        "your weights look normalised over the queries: take the softmax over the keys "
        "(dim=-1).",
        _wrong_gqa(softmax_dim=-2),
    ),
    Mistake(
        "kv_cache_step",
        "cache not updated",
        "the cache you return looks unchanged: return the keys and values with the new "
        "ones appended.",
        _wrong_kv(update=False),
    ),
    Mistake(
        "kv_cache_step",
        "new token not attended",
        "your new tokens seem to attend only to the old cache: append the new keys and "
        "values first, then attend (a token sees itself).",
        _wrong_kv(include_new=False),
    ),
    Mistake(
        "kv_cache_step",
        "prepended",
        "your cache holds the new keys before the old ones: append them at the end "
        "(torch.cat([cache, new], dim=-2)).",
        _wrong_kv(order="prepend"),
    ),
    Mistake(
        "kv_cache_step",
        "no causal mask between new tokens",
        "with several new tokens, each may see the cache and the new tokens up to itself "
        "only: add a causal mask of shape (s, t + s).",
        _wrong_kv(causal=False),
    ),
    Mistake(
        "kv_cache_step",
        "repeat instead of repeat_interleave",
        "query heads seem to use key/value head j % g: head j must use j // (h // g).",
        _wrong_kv(gqa=_wrong_gqa(expand="repeat")),
    ),
]

# exercise 11, FlashAttention's backward pass: the slips chapter 11 shares
MISTAKES += [
    Mistake("FlashAttentionFunction", name, hint, wrong_flash_function(**slips))
    for name, hint, slips in SLIPS
]
# the wrapper's own test fails on all of them too; three are named there, since each name
# costs every failing test one more run of the mistake
MISTAKES += [
    Mistake("flash_attention_autograd", name, hint, _wrong_flash_autograd(**slips))
    for name, hint, slips in SLIPS[:3]
]

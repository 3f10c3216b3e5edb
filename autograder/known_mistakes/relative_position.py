"""Known mistakes of relative position: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import math

import torch

from autograder.grading.judging.spec import Mistake
from solutions import relative_position as ref


def _offsets(n):
    positions = torch.arange(n)
    return positions[None, :] - positions[:, None]  # (n, n), j - i


def _index_transposed(n, max_distance, device=None):
    return (-_offsets(n)).clamp(-max_distance, max_distance) + max_distance


def _index_no_shift(n, max_distance, device=None):
    return _offsets(n).clamp(-max_distance, max_distance)


def _index_clip_k_minus_1(n, max_distance, device=None):
    return _offsets(n).clamp(-(max_distance - 1), max_distance - 1) + max_distance


def _index_absolute_distance(n, max_distance, device=None):
    return _offsets(n).abs().clamp(max=max_distance)


def _index_unclipped(n, max_distance, device=None):
    return _offsets(n) + max_distance


def _index_upper_2k_minus_1(n, max_distance, device=None):
    return (_offsets(n) + max_distance).clamp(0, 2 * max_distance - 1)


def _embedding_with(index_fn):
    """RelativePositionEmbedding whose lookup uses a wrong index; negative indices wrap."""

    class Wrong(ref.RelativePositionEmbedding):
        def forward(self, n):
            return self.embeddings.weight[index_fn(n, self.max_distance)]

    return Wrong


def _logits_wrong(
    *, scale_relative=True, transpose=False, relative=True, scale="sqrt", keys=False
):
    def logits(q, k, a_k):
        d = q.shape[-1]
        divide = {"sqrt": math.sqrt(d), "d": d, "none": 1.0}[scale]
        a = a_k.transpose(0, 1) if transpose else a_k
        content = q @ k.transpose(-2, -1) / divide
        if not relative:
            return content
        if keys:  # the keys, not the queries, meet the edge vectors
            rel = torch.einsum("bhjd,ijd->bhij", k, a)
        else:
            rel = torch.einsum("bhid,ijd->bhij", q, a)
        return content + (rel / divide if scale_relative else rel)

    return logits


def _output_wrong(
    *, relative=True, transpose_a=False, unweighted=False, transpose_w=False
):
    def output(weights, v, a_v):
        content = weights @ v
        if not relative:
            return content
        a = a_v.transpose(0, 1) if transpose_a else a_v
        if unweighted:
            return content + a.sum(1)
        w = weights.transpose(-2, -1) if transpose_w else weights
        return content + torch.einsum("bhij,ijd->bhid", w, a)

    return output


def _module_wrong(
    *,
    logits=ref.relative_attention_logits,
    output=ref.relative_attention_output,
    transpose_tables=False,
    scale_by_d_model=False,
    ignore_mask=False,
    fill=None,
):
    class Wrong(ref.RelativeMultiHeadAttention):
        def forward(self, x, mask=None):
            batch, n, d_model = x.shape

            def split(t):
                return t.view(batch, n, self.num_heads, self.d_k).transpose(1, 2)

            q, k, v = split(self.W_q(x)), split(self.W_k(x)), split(self.W_v(x))
            a_k, a_v = self.rel_k(n), self.rel_v(n)
            if transpose_tables:
                a_k, a_v = a_k.transpose(0, 1), a_v.transpose(0, 1)
            scores = logits(q, k, a_k)
            if scale_by_d_model:
                scores = scores * math.sqrt(self.d_k) / math.sqrt(d_model)
            if mask is not None and not ignore_mask:
                mask = mask.unsqueeze(-3)
                value = torch.finfo(scores.dtype).min if fill is None else fill
                scores = scores.masked_fill(~mask, value)
            weights = torch.softmax(scores, dim=-1)
            if mask is not None and not ignore_mask and fill is None:
                weights = weights.masked_fill(~mask, 0.0)
            z = output(weights, v, a_v)
            return self.W_o(z.transpose(1, 2).reshape(batch, n, d_model)), weights

    return Wrong


def _alibi_wrong(*, reverse=False, sign=-1.0, halving=False, signed=False, first=1):
    def bias(n, num_heads, device=None):
        heads = torch.arange(first, first + num_heads)
        if halving:  # 1/2, 1/4, ... whatever the number of heads
            slopes = 2.0 ** (-heads.double())
        else:
            slopes = 2.0 ** (-8.0 * heads.double() / num_heads)
        if reverse:
            slopes = slopes.flip(0)
        offsets = _offsets(n).double()
        distance = (
            -offsets if signed else offsets.abs()
        )  # signed: i - j, negative above the diagonal
        return (sign * slopes[:, None, None] * distance).float()

    return bias


INDEX = "relative_position_index"
EMBEDDING = "RelativePositionEmbedding"
LOGITS = "relative_attention_logits"
OUTPUT = "relative_attention_output"
MODULE = "RelativeMultiHeadAttention"
MISTAKES = [
    Mistake(
        INDEX,
        "transposed (i - j)",
        "your index looks transposed: the offset is j - i (key minus query), so index[0, 1] = k + 1.",
        _index_transposed,
    ),
    Mistake(
        INDEX,
        "no +k shift",
        "your indices look like clipped offsets in [-k, k]: add k so that they are rows 0..2k of the table.",
        _index_no_shift,
    ),
    Mistake(
        INDEX,
        "clipped at k - 1",
        "your offsets look clipped at k - 1: clip j - i to [-k, k], so that the indices reach 0 and 2k.",
        _index_clip_k_minus_1,
    ),
    Mistake(
        INDEX,
        "absolute distance",
        "your index ignores the direction: use the signed offset j - i (keys before and after the query differ), not |j - i|.",
        _index_absolute_distance,
    ),
    Mistake(
        INDEX,
        "not clipped",
        "your indices exceed 2k for distant pairs: clip j - i to [-k, k] before adding k.",
        _index_unclipped,
    ),
    Mistake(
        INDEX,
        "upper bound 2k - 1",
        "your largest index is 2k - 1: the table has 2k + 1 rows, 0..2k; clip j - i to [-k, k] and then add k.",
        _index_upper_2k_minus_1,
    ),
    Mistake(
        EMBEDDING,
        "transposed lookup",
        "your lookup looks transposed: entry [i, j] must read row clip(j - i, k) + k (key minus query).",
        _embedding_with(_index_transposed),
    ),
    Mistake(
        EMBEDDING,
        "no +k shift",
        "your lookup reads row clip(j - i, k) without adding k (negative rows wrap around to the end of the table): add k.",
        _embedding_with(_index_no_shift),
    ),
    Mistake(
        EMBEDDING,
        "clipped at k - 1",
        "your lookup clips offsets at k - 1: the first and last rows (offsets -k and +k) are never used.",
        _embedding_with(_index_clip_k_minus_1),
    ),
    Mistake(
        EMBEDDING,
        "absolute distance",
        "your lookup ignores the direction: offsets j - i and i - j must read different rows.",
        _embedding_with(_index_absolute_distance),
    ),
    Mistake(
        LOGITS,
        "relative term unscaled",
        "your relative term q_i . a_ij looks unscaled: divide the whole logit, both terms, by sqrt(d).",
        _logits_wrong(scale_relative=False),
    ),
    Mistake(
        LOGITS,
        "a_ij transposed",
        "your relative term uses a_k[j, i] instead of a_k[i, j]: the first axis of a_k is the query position.",
        _logits_wrong(transpose=True),
    ),
    Mistake(
        LOGITS,
        "relative term missing",
        "your logits look like plain q k^T / sqrt(d): add the relative term q_i . a_ij.",
        _logits_wrong(relative=False),
    ),
    Mistake(
        LOGITS,
        "scaled by d",
        "your logits look divided by d: the scale is 1/sqrt(d).",
        _logits_wrong(scale="d"),
    ),
    Mistake(
        LOGITS,
        "unscaled",
        "your logits look unscaled: divide q_i . (k_j + a_ij) by sqrt(d).",
        _logits_wrong(scale="none"),
    ),
    Mistake(
        LOGITS,
        "keys meet the edges",
        "your relative term multiplies a_ij with the keys: it is the query q_i that meets a_ij, as in q_i . (k_j + a_ij).",
        _logits_wrong(keys=True),
    ),
    Mistake(
        OUTPUT,
        "a^V ignored",
        "your output looks like plain weights @ v: add the weighted edge vectors sum_j w_ij a_ij.",
        _output_wrong(relative=False),
    ),
    Mistake(
        OUTPUT,
        "a_ij transposed",
        "your output uses a_v[j, i] instead of a_v[i, j]: the first axis of a_v is the query position.",
        _output_wrong(transpose_a=True),
    ),
    Mistake(
        OUTPUT,
        "edges not weighted",
        "your output adds the edge vectors unweighted: each a_ij is multiplied by the same weight w_ij as v_j.",
        _output_wrong(unweighted=True),
    ),
    Mistake(
        OUTPUT,
        "weights transposed",
        "your relative term uses w_ji instead of w_ij: row i of the weights belongs to query i.",
        _output_wrong(transpose_w=True),
    ),
    Mistake(
        MODULE,
        "a^V ignored",
        "your layer ignores rel_v: the head outputs are sum_j w_ij (v_j + a^V_ij), not weights @ v.",
        _module_wrong(output=_output_wrong(relative=False)),
    ),
    Mistake(
        MODULE,
        "relative term unscaled",
        "your logits look like q k^T / sqrt(d_k) + q a^T: divide the relative term by sqrt(d_k) too.",
        _module_wrong(logits=_logits_wrong(scale_relative=False)),
    ),
    Mistake(
        MODULE,
        "offsets reversed",
        "your relative vectors look transposed (offset i - j): pair (query i, key j) uses w_clip(j - i, k).",
        _module_wrong(transpose_tables=True),
    ),
    Mistake(
        MODULE,
        "scaled by sqrt(d_model)",
        "your logits look divided by sqrt(d_model): each head divides by the square root of its own width, d_k = d_model / h.",
        _module_wrong(scale_by_d_model=True),
    ),
    Mistake(
        MODULE,
        "a^K ignored",
        "your attention weights ignore rel_k: the logits are q_i . (k_j + a^K_ij) / sqrt(d_k).",
        _module_wrong(logits=_logits_wrong(relative=False)),
    ),
    Mistake(
        MODULE,
        "mask ignored",
        "your layer ignores the mask: hide the keys where it is False (True = may attend).",
        _module_wrong(ignore_mask=True),
    ),
    Mistake(
        MODULE,
        "-inf fill",
        "a fully masked query row gives NaN: filling with -inf makes the softmax divide 0 by 0; zero the weights of masked keys instead.",
        _module_wrong(fill=float("-inf")),
    ),
    Mistake(
        "alibi_bias",
        "slopes reversed",
        "your slopes look reversed: head 1 has the steepest slope 2^(-8/H), the last head 2^-8.",
        _alibi_wrong(reverse=True),
    ),
    Mistake(
        "alibi_bias",
        "positive bias",
        "your bias is positive: ALiBi subtracts m_h |i - j|, a penalty that grows with distance.",
        _alibi_wrong(sign=1.0),
    ),
    Mistake(
        "alibi_bias",
        "slopes 1/2^h",
        "your slopes look like 1/2, 1/4, ... whatever the number of heads: m_h = 2^(-8h/H), which is 1/2^h only for H = 8.",
        _alibi_wrong(halving=True),
    ),
    Mistake(
        "alibi_bias",
        "signed distance",
        "your bias is positive above the diagonal: use the distance |i - j|, so the matrix is symmetric.",
        _alibi_wrong(signed=True),
    ),
    Mistake(
        "alibi_bias",
        "heads counted from 0",
        "your first head has slope 1 (no penalty at h = 0): count heads from 1, m_h = 2^(-8h/H) for h = 1..H.",
        _alibi_wrong(first=0),
    ),
]

"""Hidden tests for chapter 7, relative position representations (15 points)."""

import math

import torch

from autograder.grading.spec import HiddenTest, Init, Mistake, case
from solutions import relative_position as ref


def _randn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


def _index_cases(g):
    return [
        case(5, 2, label="n = 5, k = 2 (the chapter's worked example)"),
        case(12, 3, label="n = 12, k = 3: clipped on both sides"),
        case(4, 6, label="n = 4 < k = 6: nothing clipped"),
        case(1, 3, label="n = 1"),
        case(9, 1, label="k = 1"),
    ]


def _embedding_cases(g):
    return [
        case(6, init=Init((2, 3)), label="k = 2, d = 3, n = 6"),
        case(13, init=Init((3, 8)), label="k = 3, d = 8, n = 13 > 2k + 1"),
        case(3, init=Init((5, 4)), label="n = 3 < k = 5"),
        case(1, init=Init((1, 5)), label="n = 1"),
    ]


def _logits_inputs(g, batch, heads, n, d, zero=False):
    a_k = torch.zeros(n, n, d) if zero else _randn(g, n, n, d)
    return _randn(g, batch, heads, n, d), _randn(g, batch, heads, n, d), a_k


def _logits_cases(g):
    return [
        case(*_logits_inputs(g, 2, 3, 5, 8), label="B = 2, h = 3, n = 5, d = 8"),
        case(*_logits_inputs(g, 3, 2, 11, 16), label="B = 3, h = 2, n = 11, d = 16"),
        case(*_logits_inputs(g, 1, 4, 7, 4), label="one sequence, four heads"),
        case(*_logits_inputs(g, 2, 1, 1, 4), label="n = 1"),
        case(
            *_logits_inputs(g, 2, 2, 6, 8, zero=True),
            label="a_k = 0 gives ordinary scaled dot products",
        ),
    ]


def _output_inputs(g, batch, heads, n, d):
    weights = torch.softmax(_randn(g, batch, heads, n, n, scale=2.0), dim=-1)
    return weights, _randn(g, batch, heads, n, d), _randn(g, n, n, d)


def _output_cases(g):
    return [
        case(*_output_inputs(g, 2, 3, 5, 8), label="B = 2, h = 3, n = 5, d = 8"),
        case(*_output_inputs(g, 3, 2, 10, 4), label="B = 3, h = 2, n = 10, d = 4"),
        case(*_output_inputs(g, 1, 4, 6, 16), label="one sequence, four heads"),
        case(*_output_inputs(g, 2, 1, 1, 4), label="n = 1"),
    ]


def _module_cases(g):
    return [
        case(
            _randn(g, 2, 9, 16),
            init=Init((16, 4, 3)),
            label="d_model 16, 4 heads, k = 3, n = 9",
        ),
        case(_randn(g, 3, 4, 12), init=Init((12, 3, 6)), label="n = 4 < k = 6"),
        case(_randn(g, 1, 12, 8), init=Init((8, 1, 2)), label="one head, n = 12"),
        case(_randn(g, 2, 1, 8), init=Init((8, 2, 2)), label="n = 1"),
    ]


def _module_masked_cases(g):
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    padding = (torch.tensor([7, 3])[:, None] > torch.arange(7)).unsqueeze(
        1
    )  # (B, 1, n)
    fully_masked = torch.rand(2, 6, 6, generator=g) < 0.6
    fully_masked[..., 0] = True
    fully_masked[1, 2] = False  # query 2 of sequence 1 may attend to nothing
    return [
        case(
            _randn(g, 2, 8, 16),
            mask=causal,
            init=Init((16, 4, 3)),
            label="causal mask (n, n)",
        ),
        case(
            _randn(g, 2, 7, 12),
            mask=padding,
            init=Init((12, 2, 2)),
            label="padding mask (B, 1, n)",
        ),
        case(
            _randn(g, 2, 6, 8),
            mask=fully_masked,
            init=Init((8, 2, 4)),
            label="mask (B, n, n) with a fully masked query row",
        ),
    ]


def _alibi_cases(g):
    return [
        case(6, 8, label="n = 6, 8 heads"),
        case(5, 4, label="n = 5, 4 heads"),
        case(9, 16, label="n = 9, 16 heads"),
        case(1, 2, label="n = 1, 2 heads"),
    ]


TESTS = [
    HiddenTest(
        id="rp_index_values",
        exercise="relative_position_index",
        points=2,
        description="an (n, n) long tensor with index[i, j] = clip(j - i, -k, k) + k",
        make_cases=_index_cases,
        level="exact",
    ),
    HiddenTest(
        id="rp_embedding_lookup",
        exercise="RelativePositionEmbedding",
        points=2,
        description="the (n, n, d) lookup returns table row clip(j - i, k) + k at [i, j]",
        make_cases=_embedding_cases,
    ),
    HiddenTest(
        id="rp_logits",
        exercise="relative_attention_logits",
        points=3,
        description="e_ij = q_i . (k_j + a_ij) / sqrt(d) for several batch, head and length sizes",
        make_cases=_logits_cases,
    ),
    HiddenTest(
        id="rp_output",
        exercise="relative_attention_output",
        points=2,
        description="z_i = sum_j w_ij (v_j + a_ij) for several batch, head and length sizes",
        make_cases=_output_cases,
    ),
    HiddenTest(
        id="rp_module",
        exercise="RelativeMultiHeadAttention",
        points=2,
        description="outputs and per-head weights of relation-aware multi-head self-attention",
        make_cases=_module_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=("sdpa", "mha"),
    ),
    HiddenTest(
        id="rp_module_masked",
        exercise="RelativeMultiHeadAttention",
        points=2,
        description="causal, padding and fully masked rows (True = may attend), shared by all heads",
        make_cases=_module_masked_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=("sdpa", "mha"),
    ),
    HiddenTest(
        id="alibi_bias_values",
        exercise="alibi_bias",
        points=2,
        description="bias[h - 1, i, j] = -m_h |i - j| with slopes m_h = 2^(-8h/H)",
        make_cases=_alibi_cases,
    ),
]


# ---------------------------------------------------------------- plausible wrong answers


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

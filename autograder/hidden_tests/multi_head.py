"""Hidden tests for chapter 4, multi-head attention (12 points)."""

import math

import torch
import torch.nn.functional as F

from autograder.grading.spec import HiddenTest, Init, Mistake, case, torch_layer
from solutions import multi_head as ref


def _randn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


def _random_mask(g, *shape):
    """A bool mask with at least one True per query row."""
    mask = torch.rand(*shape, generator=g) < 0.6
    mask[..., torch.randint(shape[-1], (), generator=g)] = True
    return mask


def _causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def _padding(lengths, n):
    return (torch.arange(n) < torch.tensor(lengths)[:, None]).unsqueeze(1)  # (B, 1, n)


# ------------------------------------------------------------------------------ attention


def _attention_cases(g):
    fully_masked = _random_mask(g, 2, 1, 5, 5)
    fully_masked[1, 0, 3] = False  # query 3 of sequence 1 may attend to nothing
    return [
        case(
            _randn(g, 2, 3, 5, 8),
            _randn(g, 2, 3, 5, 8),
            _randn(g, 2, 3, 5, 8),
            label="heads as a batch dimension (B, h, n, d_head)",
        ),
        case(
            _randn(g, 2, 4, 3, 6),
            _randn(g, 2, 4, 7, 6),
            _randn(g, 2, 4, 7, 5),
            mask=_padding([7, 4], 7).unsqueeze(1),
            label="cross-attention with a padding mask (B, 1, 1, n_k)",
        ),
        case(
            _randn(g, 1, 2, 6, 4),
            _randn(g, 1, 2, 6, 4),
            _randn(g, 1, 2, 6, 4),
            mask=_causal(6),
            label="causal mask (n, n) broadcast over batch and heads",
        ),
        case(
            _randn(g, 2, 2, 5, 8, scale=4.0),
            _randn(g, 2, 2, 5, 8, scale=4.0),
            _randn(g, 2, 2, 5, 8),
            mask=fully_masked,
            label="a fully masked query row must give zeros",
        ),
    ]


# ---------------------------------------------------------------- split_heads, merge_heads


def _split_cases(g):
    return [
        case(_randn(g, 2, 5, 12), 3, label="(2, 5, 12) into 3 heads"),
        case(_randn(g, 3, 4, 8), 4, label="(3, 4, 8) into 4 heads (n = h)"),
        case(_randn(g, 1, 1, 6), 6, label="one token, heads of width 1"),
        case(_randn(g, 2, 3, 8), 1, label="a single head"),
    ]


def _merge_cases(g):
    return [
        case(_randn(g, 2, 3, 5, 4), label="(2, 3, 5, 4): 3 heads of width 4"),
        case(_randn(g, 3, 4, 4, 2), label="(3, 4, 4, 2): n = h"),
        case(_randn(g, 1, 6, 1, 1), label="one token, heads of width 1"),
        case(_randn(g, 2, 1, 3, 8), label="a single head"),
    ]


# ----------------------------------------------------------------------- MultiHeadAttention


def _self_attention_cases(g):
    x = _randn(g, 2, 6, 16)
    return [
        case(x, x, x, init=Init((16, 4)), label="self-attention, no mask"),
        case(x, x, x, mask=_causal(6), init=Init((16, 4)), label="causal mask (n, n)"),
        case(
            *(3 * [_randn(g, 3, 5, 12)]),
            mask=_random_mask(g, 3, 5, 5),
            init=Init((12, 3)),
            label="a (B, n, n) mask with B = h = 3",
        ),
        case(*(3 * [_randn(g, 2, 1, 8)]), init=Init((8, 2)), label="one token"),
    ]


def _cross_attention_cases(g):
    memory = _randn(g, 2, 7, 16)
    return [
        case(
            _randn(g, 2, 3, 16),
            _randn(g, 2, 7, 16),
            _randn(g, 2, 7, 16),
            init=Init((16, 4)),
            label="n_q = 3, n_k = 7, key and value different",
        ),
        case(
            _randn(g, 2, 3, 16),
            memory,
            memory,
            mask=_padding([7, 4], 7),
            init=Init((16, 4)),
            label="padding mask (B, 1, n_k)",
        ),
        case(
            _randn(g, 2, 4, 8),
            _randn(g, 2, 6, 8),
            _randn(g, 2, 6, 8),
            mask=_random_mask(g, 2, 4, 6),
            init=Init((8, 2)),
            label="a (B, n_q, n_k) mask with B = h = 2",
        ),
    ]


def _no_bias_cases(g):
    init = Init((12, 3), {"bias": False})
    x = _randn(g, 2, 5, 12)
    return [
        case(x, x, x, init=init, label="bias=False, self-attention"),
        case(
            _randn(g, 2, 4, 12),
            x,
            x,
            mask=_random_mask(g, 4, 5),
            init=init,
            label="bias=False, cross-attention with a (n_q, n_k) mask",
        ),
    ]


def _torch_state(g, d_model, bias):
    """Random weights for nn.MultiheadAttention (whose own init sets the biases to zero)."""
    state = {
        "in_proj_weight": _randn(g, 3 * d_model, d_model, scale=d_model**-0.5),
        "out_proj.weight": _randn(g, d_model, d_model, scale=d_model**-0.5),
    }
    if bias:
        state["in_proj_bias"] = _randn(g, 3 * d_model, scale=0.5)
        state["out_proj.bias"] = _randn(g, d_model, scale=0.5)
    return state


def _from_torch(g, d_model, num_heads, bias=True):
    """Build our layer without weights, then copy a PyTorch layer's with load_torch_weights."""
    layer = torch_layer(
        "MultiheadAttention",
        d_model,
        num_heads,
        bias=bias,
        batch_first=True,
        state=_torch_state(g, d_model, bias),
    )
    return {
        "init": Init((d_model, num_heads), {"bias": bias}, load_state=False),
        "setup": [("load_torch_weights", (layer,))],
    }


def _torch_weights_cases(g):
    x = _randn(g, 2, 6, 16)
    memory = _randn(g, 3, 7, 8)
    return [
        case(x, x, x, label="self-attention", **_from_torch(g, 16, 4)),
        case(
            x,
            x,
            x,
            mask=_causal(6),
            label="self-attention, causal mask",
            **_from_torch(g, 16, 4),
        ),
        case(
            _randn(g, 3, 2, 8),
            memory,
            memory,
            mask=_padding([7, 5, 1], 7),
            label="cross-attention, padding mask",
            **_from_torch(g, 8, 2),
        ),
        case(
            *(3 * [_randn(g, 2, 5, 12)]),
            label="bias=False",
            **_from_torch(g, 12, 3, bias=False),
        ),
    ]


_NO_DELEGATION = ("mha", "sdpa")

TESTS = [
    HiddenTest(
        id="mh_attention_heads",
        exercise="attention",
        points=2,
        description="softmax(q k^T / sqrt(d_k)) v over (B, h, n, d_head) tensors, masks broadcast over heads, empty rows give zeros",
        make_cases=_attention_cases,
        outputs=("out", "weights"),
        forbidden=("sdpa",),
    ),
    HiddenTest(
        id="split_heads_values",
        exercise="split_heads",
        points=1,
        description="(B, n, d_model) -> (B, h, n, d_head), head i holding features i d_head to (i+1) d_head - 1",
        make_cases=_split_cases,
        level="exact",
    ),
    HiddenTest(
        id="merge_heads_values",
        exercise="merge_heads",
        points=1,
        description="(B, h, n, d_head) -> (B, n, h d_head), the exact inverse of split_heads",
        make_cases=_merge_cases,
        level="exact",
    ),
    HiddenTest(
        id="mha_self_attention",
        exercise="MultiHeadAttention",
        points=2,
        description="multi-head self-attention with W_q, W_k, W_v, W_o, with and without masks, per-head weights",
        make_cases=_self_attention_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=_NO_DELEGATION,
    ),
    HiddenTest(
        id="mha_cross_attention",
        exercise="MultiHeadAttention",
        points=2,
        description="multi-head cross-attention (n_q != n_k) with padding and per-query masks",
        make_cases=_cross_attention_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=_NO_DELEGATION,
    ),
    HiddenTest(
        id="mha_no_bias",
        exercise="MultiHeadAttention",
        points=1,
        description="MultiHeadAttention(d_model, num_heads, bias=False) has and uses no biases",
        make_cases=_no_bias_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=_NO_DELEGATION,
    ),
    HiddenTest(
        id="mha_torch_weights",
        exercise="MultiHeadAttention",
        points=3,
        description="after load_torch_weights, outputs and per-head weights equal nn.MultiheadAttention's with the same weights",
        make_cases=_torch_weights_cases,
        level="module",
        outputs=("out", "weights"),
        forbidden=_NO_DELEGATION,
    ),
]


# ---------------------------------------------------------------- plausible wrong answers


def _wrong_attention(*, scale=True, softmax_dim=-1, invert_mask=False, fill=None):
    """attention with one deliberate slip; ``fill``: the value put in masked scores by a
    version that does not zero the masked weights afterwards."""

    def attention(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1)
        if scale:
            scores = scores / math.sqrt(q.size(-1))
        if mask is not None:
            mask = ~mask if invert_mask else mask
            value = torch.finfo(scores.dtype).min if fill is None else fill
            scores = scores.masked_fill(~mask, value)
        weights = torch.softmax(scores, dim=softmax_dim)
        if mask is not None and fill is None:
            weights = weights.masked_fill(~mask, 0.0)
        return weights @ v, weights

    return attention


def _split_no_transpose(x, num_heads):
    batch, n, d_model = x.shape
    return x.reshape(batch, n, num_heads, d_model // num_heads)


def _split_straight_reshape(x, num_heads):
    batch, n, d_model = x.shape
    return x.reshape(batch, num_heads, n, d_model // num_heads)


def _split_strided(x, num_heads):
    batch, n, d_model = x.shape
    return x.reshape(batch, n, d_model // num_heads, num_heads).permute(0, 3, 1, 2)


def _split_features_first(x, num_heads):
    batch, n, d_model = x.shape
    return x.reshape(batch, n, num_heads, d_model // num_heads).permute(0, 2, 3, 1)


def _merge_no_transpose(x):
    batch, num_heads, n, d_head = x.shape
    return x.reshape(batch, n, num_heads * d_head)


def _merge_interleaved(x):
    batch, num_heads, n, d_head = x.shape
    return x.permute(0, 2, 3, 1).reshape(batch, n, num_heads * d_head)


def _merge_summed(x):
    return x.sum(dim=1)


def _merge_not_flattened(x):
    return x.transpose(1, 2)


class _MHA(ref.MultiHeadAttention):
    """The reference with hooks that the wrong answers below override."""

    attention = staticmethod(ref.attention)

    def split(self, x):
        return ref.split_heads(x, self.num_heads)

    def merge(self, x):
        return ref.merge_heads(x)

    def project(self, linear, x):
        return linear(x)

    def head_mask(self, mask):
        return mask.unsqueeze(1) if mask is not None and mask.dim() == 3 else mask

    def forward(self, query, key, value, mask=None):
        q = self.split(self.project(self.W_q, query))
        k = self.split(self.project(self.W_k, key))
        v = self.split(self.project(self.W_v, value))
        out, weights = self.attention(q, k, v, self.head_mask(mask))
        return self.output(self.merge(out)), self.returned_weights(weights)

    def output(self, merged):
        return self.project(self.W_o, merged)

    def returned_weights(self, weights):
        return weights


class _ScaledByDModel(_MHA):
    def attention(self, q, k, v, mask=None):
        # attention divides by sqrt(d_head); a further sqrt(h) makes it sqrt(d_model)
        return ref.attention(q / math.sqrt(self.num_heads), k, v, mask)


class _SoftmaxOverQueries(_MHA):
    attention = staticmethod(_wrong_attention(softmax_dim=-2))


class _InvertedMask(_MHA):
    def head_mask(self, mask):
        return None if mask is None else super().head_mask(~mask)


class _WeightsAveraged(_MHA):
    def returned_weights(self, weights):
        return weights.mean(dim=1)


class _NoOutputProjection(_MHA):
    def output(self, merged):
        return merged


class _QueryKeySwapped(_MHA):
    def forward(self, query, key, value, mask=None):
        q = self.split(self.W_k(query))
        k = self.split(self.W_q(key))
        v = self.split(self.W_v(value))
        out, weights = ref.attention(q, k, v, self.head_mask(mask))
        return self.W_o(self.merge(out)), weights


class _MergedWithoutTranspose(_MHA):
    def merge(self, x):
        return _merge_no_transpose(x)


class _SplitWithoutTranspose(_MHA):
    def split(self, x):
        return _split_straight_reshape(x, self.num_heads)


class _BiasIgnored(_MHA):
    def project(self, linear, x):
        return F.linear(x, linear.weight)


class _MaskNotBroadcastOverHeads(_MHA):
    def head_mask(self, mask):
        return mask


class _TorchWeightsTransposed(ref.MultiHeadAttention):
    def load_torch_weights(self, mha):
        super().load_torch_weights(mha)
        with torch.no_grad():
            for linear in (self.W_q, self.W_k, self.W_v, self.W_o):
                linear.weight.copy_(linear.weight.T.clone())


MHA = "MultiHeadAttention"
MISTAKES = [
    Mistake(
        "attention",
        "unscaled",
        "your scores look unscaled: did you divide q k^T by sqrt(d_k), the width of one head?",
        _wrong_attention(scale=False),
    ),
    Mistake(
        "attention",
        "softmax over queries",
        "your weights look normalised over the queries: take the softmax over the last "
        "dimension (the keys), so that each query's row sums to 1.",
        _wrong_attention(softmax_dim=-2),
    ),
    Mistake(
        "attention",
        "inverted mask",
        "your mask looks inverted: True means the query MAY attend to that key; hide the "
        "positions where the mask is False.",
        _wrong_attention(invert_mask=True),
    ),
    Mistake(
        "attention",
        "-inf fill",
        "a fully masked row comes out as NaN: filling with -inf makes its softmax 0/0; give "
        "rows that may attend to nothing zero weights.",
        _wrong_attention(fill=float("-inf")),
    ),
    Mistake(
        "split_heads",
        "no transpose",
        "your heads come out as (B, n, h, d_head): after cutting the features into h blocks, "
        "move the head dimension in front of the tokens (transpose(1, 2)).",
        _split_no_transpose,
    ),
    Mistake(
        "split_heads",
        "straight reshape",
        "you seem to reshape (B, n, d_model) straight to (B, h, n, d_head): that cuts across "
        "tokens, so one head gets pieces of several tokens. Reshape to (B, n, h, d_head) first, "
        "then transpose.",
        _split_straight_reshape,
    ),
    Mistake(
        "split_heads",
        "strided split",
        "your head i seems to get features i, i + h, i + 2h, ...: head i must get the "
        "consecutive block of features i*d_head to (i+1)*d_head - 1 (reshape to "
        "(B, n, h, d_head), not (B, n, d_head, h)).",
        _split_strided,
    ),
    Mistake(
        "split_heads",
        "features before tokens",
        "your heads come out as (B, h, d_head, n): the tokens must come before the features, "
        "(B, h, n, d_head); swap only the token and head dimensions.",
        _split_features_first,
    ),
    Mistake(
        "merge_heads",
        "no transpose",
        "you seem to reshape (B, h, n, d_head) straight to (B, n, d_model): that mixes tokens "
        "of different positions. Transpose to (B, n, h, d_head) first, then reshape.",
        _merge_no_transpose,
    ),
    Mistake(
        "merge_heads",
        "interleaved",
        "your merge interleaves the heads' features: token t's output must be head 0's "
        "features, then head 1's, and so on (transpose(1, 2), not a permute that puts the "
        "heads last).",
        _merge_interleaved,
    ),
    Mistake(
        "merge_heads",
        "heads summed",
        "your merge adds the heads up: concatenate them instead, so the result has "
        "h * d_head features per token.",
        _merge_summed,
    ),
    Mistake(
        "merge_heads",
        "not flattened",
        "your result still has a head dimension: after the transpose, reshape (B, n, h, "
        "d_head) to (B, n, h * d_head).",
        _merge_not_flattened,
    ),
    Mistake(
        MHA,
        "scaled by d_model",
        "your scores look divided by sqrt(d_model): each head's scores are divided by "
        "sqrt(d_head) = sqrt(d_model / h), the width of that head's queries.",
        _ScaledByDModel,
    ),
    Mistake(
        MHA,
        "softmax over queries",
        "your weights look normalised over the queries: take the softmax over the last "
        "dimension (the keys).",
        _SoftmaxOverQueries,
    ),
    Mistake(
        MHA,
        "inverted mask",
        "your mask looks inverted, as in nn.MultiheadAttention's convention: in this course "
        "True means MAY attend; hide the positions where the mask is False.",
        _InvertedMask,
    ),
    Mistake(
        MHA,
        "weights averaged over heads",
        "your weights look averaged over the heads: return every head's weights, shape "
        "(B, h, n_q, n_k).",
        _WeightsAveraged,
    ),
    Mistake(
        MHA,
        "no output projection",
        "your output looks like the merged heads without W_o: apply the output projection "
        "after merging.",
        _NoOutputProjection,
    ),
    Mistake(
        MHA,
        "queries and keys swapped",
        "queries and keys look swapped: queries are W_q(query), keys are W_k(key).",
        _QueryKeySwapped,
    ),
    Mistake(
        MHA,
        "heads merged without transpose",
        "your heads look merged without a transpose: (B, h, n, d_head) must become "
        "(B, n, h, d_head) before the reshape to (B, n, d_model).",
        _MergedWithoutTranspose,
    ),
    Mistake(
        MHA,
        "heads split without transpose",
        "your heads look split by a reshape straight to (B, h, n, d_head): reshape to "
        "(B, n, h, d_head), then transpose.",
        _SplitWithoutTranspose,
    ),
    Mistake(
        MHA,
        "bias ignored",
        "your projections seem to ignore their biases: call the nn.Linear layers "
        "(self.W_q(query), ...) rather than multiplying by their weights.",
        _BiasIgnored,
    ),
    Mistake(
        MHA,
        "mask not broadcast over heads",
        "a (B, n_q, n_k) mask seems to be matched with the heads, not the batch: insert a "
        "head dimension (mask.unsqueeze(1)) so every head of sequence b uses mask[b].",
        _MaskNotBroadcastOverHeads,
    ),
    Mistake(
        MHA,
        "torch weights transposed",
        "the weights copied from nn.MultiheadAttention look transposed: in_proj_weight and "
        "out_proj.weight are already in nn.Linear's (out_features, in_features) layout; "
        "copy them as they are.",
        _TorchWeightsTransposed,
    ),
]

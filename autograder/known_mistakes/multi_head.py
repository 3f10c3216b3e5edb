"""Known mistakes of multi head: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import math

import torch
import torch.nn.functional as F

from autograder.grading.judging.spec import Mistake
from autograder.known_mistakes._attention import wrong_attention
from solutions import multi_head as ref


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
    attention = staticmethod(wrong_attention(softmax_dim=-2))


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
        wrong_attention(scale="none"),
        section="04_multi_head#exercise-1-attention-for-all-heads-at-once",
    ),
    Mistake(
        "attention",
        "softmax over queries",
        "your weights look normalised over the queries: take the softmax over the last "
        "dimension (the keys), so that each query's row sums to 1.",
        wrong_attention(softmax_dim=-2),
        section="04_multi_head#exercise-1-attention-for-all-heads-at-once",
    ),
    Mistake(
        "attention",
        "inverted mask",
        "your mask looks inverted: True means the query MAY attend to that key; hide the "
        "positions where the mask is False.",
        wrong_attention(invert_mask=True),
        section="04_multi_head#exercise-1-attention-for-all-heads-at-once",
    ),
    Mistake(
        "attention",
        "-inf fill",
        "a fully masked row comes out as NaN: filling with -inf makes its softmax 0/0; give "
        "rows that may attend to nothing zero weights.",
        wrong_attention(fill=float("-inf")),
        section="04_multi_head#exercise-1-attention-for-all-heads-at-once",
    ),
    Mistake(
        "split_heads",
        "no transpose",
        "your heads come out as (B, n, h, d_head): after cutting the features into h blocks, "
        "move the head dimension in front of the tokens (transpose(1, 2)).",
        _split_no_transpose,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        "split_heads",
        "straight reshape",
        "you seem to reshape (B, n, d_model) straight to (B, h, n, d_head): that cuts across "
        "tokens, so one head gets pieces of several tokens. Reshape to (B, n, h, d_head) first, "
        "then transpose.",
        _split_straight_reshape,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        "split_heads",
        "strided split",
        "your head i seems to get features i, i + h, i + 2h, ...: head i must get the "
        "consecutive block of features i*d_head to (i+1)*d_head - 1 (reshape to "
        "(B, n, h, d_head), not (B, n, d_head, h)).",
        _split_strided,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        "split_heads",
        "features before tokens",
        "your heads come out as (B, h, d_head, n): the tokens must come before the features, "
        "(B, h, n, d_head); swap only the token and head dimensions.",
        _split_features_first,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        "merge_heads",
        "no transpose",
        "you seem to reshape (B, h, n, d_head) straight to (B, n, d_model): that mixes tokens "
        "of different positions. Transpose to (B, n, h, d_head) first, then reshape.",
        _merge_no_transpose,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        "merge_heads",
        "interleaved",
        "your merge interleaves the heads' features: token t's output must be head 0's "
        "features, then head 1's, and so on (transpose(1, 2), not a permute that puts the "
        "heads last).",
        _merge_interleaved,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        "merge_heads",
        "heads summed",
        "your merge adds the heads up: concatenate them instead, so the result has "
        "h * d_head features per token.",
        _merge_summed,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        "merge_heads",
        "not flattened",
        "your result still has a head dimension: after the transpose, reshape (B, n, h, "
        "d_head) to (B, n, h * d_head).",
        _merge_not_flattened,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        MHA,
        "scaled by d_model",
        "your scores look divided by sqrt(d_model): each head's scores are divided by "
        "sqrt(d_head) = sqrt(d_model / h), the width of that head's queries.",
        _ScaledByDModel,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
    Mistake(
        MHA,
        "softmax over queries",
        "your weights look normalised over the queries: take the softmax over the last "
        "dimension (the keys).",
        _SoftmaxOverQueries,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
    Mistake(
        MHA,
        "inverted mask",
        "your mask looks inverted, as in nn.MultiheadAttention's convention: in this course "
        "True means MAY attend; hide the positions where the mask is False.",
        _InvertedMask,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
    Mistake(
        MHA,
        "weights averaged over heads",
        "your weights look averaged over the heads: return every head's weights, shape "
        "(B, h, n_q, n_k).",
        _WeightsAveraged,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
    Mistake(
        MHA,
        "no output projection",
        "your output looks like the merged heads without W_o: apply the output projection "
        "after merging.",
        _NoOutputProjection,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
    Mistake(
        MHA,
        "queries and keys swapped",
        "queries and keys look swapped: queries are W_q(query), keys are W_k(key).",
        _QueryKeySwapped,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
    Mistake(
        MHA,
        "heads merged without transpose",
        "your heads look merged without a transpose: (B, h, n, d_head) must become "
        "(B, n, h, d_head) before the reshape to (B, n, d_model).",
        _MergedWithoutTranspose,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        MHA,
        "heads split without transpose",
        "your heads look split by a reshape straight to (B, h, n, d_head): reshape to "
        "(B, n, h, d_head), then transpose.",
        _SplitWithoutTranspose,
        section="04_multi_head#exercise-2-heads-are-a-reshape",
    ),
    Mistake(
        MHA,
        "bias ignored",
        "your projections seem to ignore their biases: call the nn.Linear layers "
        "(self.W_q(query), ...) rather than multiplying by their weights.",
        _BiasIgnored,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
    Mistake(
        MHA,
        "mask not broadcast over heads",
        "a (B, n_q, n_k) mask seems to be matched with the heads, not the batch: insert a "
        "head dimension (mask.unsqueeze(1)) so every head of sequence b uses mask[b].",
        _MaskNotBroadcastOverHeads,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
    Mistake(
        MHA,
        "torch weights transposed",
        "the weights copied from nn.MultiheadAttention look transposed: in_proj_weight and "
        "out_proj.weight are already in nn.Linear's (out_features, in_features) layout; "
        "copy them as they are.",
        _TorchWeightsTransposed,
        section="04_multi_head#exercise-3-multiheadattention",
    ),
]

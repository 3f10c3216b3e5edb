"""Known mistakes of bottleneck: plausible wrong answers that every hidden test of
their exercise must fail, each with the hint the feedback gives when a student's outputs
match it."""

import math

import torch

from autograder.grading.judging.spec import Mistake
from solutions import bottleneck as ref


def _softmax_naive(x, dim=-1):
    exp = x.exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def _softmax_ignores_dim(x, dim=-1):
    e = (x - x.amax(dim=-1, keepdim=True)).exp()
    return e / e.sum(dim=-1, keepdim=True)


def _softmax_divides_by_max(x, dim=-1):
    return (
        x - x.amax(dim=dim, keepdim=True)
    ).exp()  # exp(x) / exp(max): not normalised


def _softmax_global_max(x, dim=-1):
    exp = (x - x.max()).exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def _softmax_global_sum(x, dim=-1):
    exp = (x - x.amax(dim=dim, keepdim=True)).exp()
    return exp / exp.sum()


def _softmax_no_keepdim(x, dim=-1):
    exp = (x - x.amax(dim=dim)).exp()
    return exp / exp.sum(dim=dim)


def _softmax_minus_mean(x, dim=-1):
    exp = (x - x.mean(dim=dim, keepdim=True)).exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def _pool(score, normalise, combine="values"):
    """attention_pool built from a score, a normalisation and a way to mix the values."""

    def attention_pool(query, keys, values):
        scores = score(query, keys)  # (B, n)
        weights = normalise(scores)
        mixed = keys if combine == "keys" else values
        if combine == "matmul":
            return (
                weights @ values,
                weights,
            )  # (B, n) @ (B, n, d_v) broadcasts to (B, B, d_v)
        return (weights.unsqueeze(-1) * mixed).sum(1), weights

    return attention_pool


def _dot(query, keys):
    return (keys * query.unsqueeze(1)).sum(-1)


def _scaled_dot(query, keys):
    return _dot(query, keys) / math.sqrt(query.size(-1))


def _over_keys(scores):
    return ref.softmax(scores, dim=-1)


def _uniform_pool(query, keys, values):
    weights = torch.full(keys.shape[:2], 1.0 / keys.size(1))
    return values.mean(1), weights


class _StepFixedContext(ref.Seq2SeqAttentionDecoderStep):
    """Ignores attention: the context is always the last encoder state."""

    def forward(self, token, hidden, encoder_outputs):
        context = encoder_outputs[:, -1]
        weights = torch.zeros(encoder_outputs.shape[:2])
        weights[:, -1] = 1.0
        hidden = self.gru(torch.cat([self.embedding(token), context], -1), hidden)
        return self.out(torch.cat([hidden, context], -1)), hidden, weights


class _StepMeanContext(ref.Seq2SeqAttentionDecoderStep):
    """Ignores the scores: the context is the mean of the encoder states."""

    def forward(self, token, hidden, encoder_outputs):
        context = encoder_outputs.mean(1)
        weights = torch.full(encoder_outputs.shape[:2], 1.0 / encoder_outputs.size(1))
        hidden = self.gru(torch.cat([self.embedding(token), context], -1), hidden)
        return self.out(torch.cat([hidden, context], -1)), hidden, weights


class _StepInputSwapped(ref.Seq2SeqAttentionDecoderStep):
    def forward(self, token, hidden, encoder_outputs):
        context, weights = ref.attention_pool(hidden, encoder_outputs, encoder_outputs)
        hidden = self.gru(torch.cat([context, self.embedding(token)], -1), hidden)
        return self.out(torch.cat([hidden, context], -1)), hidden, weights


class _StepOutputSwapped(ref.Seq2SeqAttentionDecoderStep):
    def forward(self, token, hidden, encoder_outputs):
        context, weights = ref.attention_pool(hidden, encoder_outputs, encoder_outputs)
        hidden = self.gru(torch.cat([self.embedding(token), context], -1), hidden)
        return self.out(torch.cat([context, hidden], -1)), hidden, weights


class _StepOldHiddenForOutput(ref.Seq2SeqAttentionDecoderStep):
    def forward(self, token, hidden, encoder_outputs):
        context, weights = ref.attention_pool(hidden, encoder_outputs, encoder_outputs)
        new = self.gru(torch.cat([self.embedding(token), context], -1), hidden)
        return self.out(torch.cat([hidden, context], -1)), new, weights


class _StepReturnsOldHidden(ref.Seq2SeqAttentionDecoderStep):
    def forward(self, token, hidden, encoder_outputs):
        context, weights = ref.attention_pool(hidden, encoder_outputs, encoder_outputs)
        new = self.gru(torch.cat([self.embedding(token), context], -1), hidden)
        return self.out(torch.cat([new, context], -1)), hidden, weights


SOFTMAX, POOL, STEP = "softmax", "attention_pool", "Seq2SeqAttentionDecoderStep"
MISTAKES = [
    Mistake(
        SOFTMAX,
        "no max subtraction",
        "your softmax gives NaN or inf on large logits: exp(1000) overflows float32. Did you "
        "subtract the maximum of each slice before exponentiating?",
        _softmax_naive,
    ),
    Mistake(
        SOFTMAX,
        "ignores dim",
        "your softmax normalises along the last dimension whatever `dim` says: did you pass "
        "`dim` on to every max and sum?",
        _softmax_ignores_dim,
    ),
    Mistake(
        SOFTMAX,
        "divides by the max",
        "your outputs do not sum to 1: exp(x - max) divides exp(x) by exp(max); did you "
        "forget to divide by the sum of the exponentials?",
        _softmax_divides_by_max,
    ),
    Mistake(
        SOFTMAX,
        "global max",
        "slices far below the others come out as NaN: did you subtract the maximum of the "
        "whole tensor (x.max()) instead of each slice's maximum along `dim`?",
        _softmax_global_max,
    ),
    Mistake(
        SOFTMAX,
        "global sum",
        "your outputs sum to 1 over the whole tensor, not along `dim`: did you call .sum() "
        "without dim=dim, keepdim=True?",
        _softmax_global_sum,
    ),
    Mistake(
        SOFTMAX,
        "no keepdim",
        "the max or the sum along `dim` seems to broadcast against the wrong dimension: did "
        "you pass keepdim=True so that it lines up with x?",
        _softmax_no_keepdim,
    ),
    Mistake(
        SOFTMAX,
        "subtracts the mean",
        "your softmax overflows when logits are far apart: subtracting the mean still leaves "
        "large positive exponents; did you subtract the maximum instead?",
        _softmax_minus_mean,
    ),
    Mistake(
        POOL,
        "softmax over the batch",
        "your weights sum to 1 over the batch, not over the n positions: did you take the "
        "softmax along dim=0 instead of the last dimension?",
        _pool(_dot, lambda s: ref.softmax(s, dim=0)),
    ),
    Mistake(
        POOL,
        "no softmax",
        "your weights look like the raw scores q . k_i: did you forget the softmax that "
        "turns them into weights that sum to 1?",
        _pool(_dot, lambda s: s),
    ),
    Mistake(
        POOL,
        "unnormalised",
        "your weights look like exp(scores) without normalisation: did you divide by their "
        "sum (or use your softmax)?",
        _pool(_dot, lambda s: s.exp()),
    ),
    Mistake(
        POOL,
        "scaled scores",
        "your scores look divided by sqrt(d): this exercise uses the plain dot product "
        "q . k_i (scaling comes in chapter 2).",
        _pool(_scaled_dot, _over_keys),
    ),
    Mistake(
        POOL,
        "keys mixed instead of values",
        "your context looks like a weighted average of the keys: the weights mix the "
        "values, sum_i alpha_i v_i.",
        _pool(_dot, _over_keys, combine="keys"),
    ),
    Mistake(
        POOL,
        "batches mixed by @",
        "your context has shape (B, B, d_v): (B, n) @ (B, n, d_v) broadcasts over the "
        "batch. Did you mean weights.unsqueeze(1) @ values, then squeeze(1)?",
        _pool(_dot, _over_keys, combine="matmul"),
    ),
    Mistake(
        POOL,
        "uniform weights",
        "your weights are uniform (1/n): did you score each key against the query before "
        "the softmax?",
        _uniform_pool,
    ),
    Mistake(
        STEP,
        "fixed context",
        "your context looks like the last encoder state at every step, the fixed-length "
        "bottleneck: did you compute it with attention_pool(hidden, encoder_outputs, "
        "encoder_outputs)?",
        _StepFixedContext,
    ),
    Mistake(
        STEP,
        "mean context",
        "your context looks like the plain mean of the encoder states: did you weight them "
        "with attention_pool, using the previous hidden state as the query?",
        _StepMeanContext,
    ),
    Mistake(
        STEP,
        "GRU input in the wrong order",
        "the GRU input looks concatenated as [context; embedding]: the docstring fixes "
        "[embedding; context].",
        _StepInputSwapped,
    ),
    Mistake(
        STEP,
        "output input in the wrong order",
        "the output layer looks fed with [context; hidden]: the docstring fixes [hidden; "
        "context], with the NEW hidden state.",
        _StepOutputSwapped,
    ),
    Mistake(
        STEP,
        "logits from the old state",
        "your logits look computed from the previous hidden state: update the GRU first, "
        "then feed the new state (with the context) to the output layer.",
        _StepOldHiddenForOutput,
    ),
    Mistake(
        STEP,
        "returns the old state",
        "the hidden state you return looks unchanged: return the GRU's new state, the one "
        "the next step starts from.",
        _StepReturnsOldHidden,
    ),
]

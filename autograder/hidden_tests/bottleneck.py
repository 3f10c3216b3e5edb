"""Hidden tests for chapter 1, the bottleneck (12 points)."""

import math

import torch

from autograder.grading.spec import HiddenTest, Init, Mistake, case
from solutions import bottleneck as ref


def _randn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


# ------------------------------------------------------------------------------- softmax


def _softmax_values_cases(g):
    return [
        case(_randn(g, 7), label="a vector"),
        case(_randn(g, 3, 5), label="the rows of a matrix (default dim=-1)"),
        case(_randn(g, 4, 4), dim=-1, label="a square matrix, dim=-1"),
        case(_randn(g, 4, 4), dim=0, label="a square matrix, dim=0"),
        case(_randn(g, 2, 5, 3), dim=1, label="the middle dimension of a 3-d tensor"),
        case(_randn(g, 2, 3, 3), dim=-2, label="dim=-2"),
        case(torch.zeros(2, 6), label="equal logits"),
        case(_randn(g, 5, 1), label="a dimension of size 1"),
    ]


def _softmax_stable_cases(g):
    offsets = torch.tensor([[1000.0], [-1000.0], [0.0], [500.0]])
    return [
        case(torch.tensor([1000.0, 1001.0, 1002.0]), label="logits around +1000"),
        case(
            torch.tensor([[-1000.0, -1001.0, -1002.0], [-800.0, -800.0, -800.0]]),
            label="logits around -1000",
        ),
        case(
            _randn(g, 4, 6, scale=3.0) + offsets,
            label="rows at very different offsets (+1000, -1000, 0, +500)",
        ),
        case(
            _randn(g, 5, 3, scale=200.0),
            dim=0,
            label="a wide spread of logits along dim=0",
        ),
        case(
            torch.tensor([[-1e4, 0.0, 1e4], [3.0, 3.0, -1e4]]),
            label="logits of -1e4, 0 and 1e4 in one row",
        ),
    ]


# ------------------------------------------------------------------------ attention_pool


def _pool_inputs(g, batch, n, d, d_v, scale=1.0):
    return (
        _randn(g, batch, d, scale=scale),
        _randn(g, batch, n, d, scale=scale),
        _randn(g, batch, n, d_v),
    )


def _attention_pool_cases(g):
    return [
        case(*_pool_inputs(g, 3, 5, 8, 4), label="B=3, n=5, d=8, d_v=4"),
        case(*_pool_inputs(g, 4, 7, 6, 6), label="B=4, n=7, d=d_v=6"),
        case(*_pool_inputs(g, 1, 3, 4, 2), label="a batch of one"),
        case(*_pool_inputs(g, 2, 12, 16, 3, scale=0.5), label="n=12, d=16"),
    ]


def _attention_pool_edge_cases(g):
    query, keys, values = _pool_inputs(g, 3, 6, 8, 5)
    keys[:, 2] = 20.0 * query  # a key that matches the query far better than the rest
    return [
        case(*_pool_inputs(g, 3, 1, 4, 2), label="a single position (n=1)"),
        case(query, keys, values, label="one key dominates: scores in the hundreds"),
        case(
            *_pool_inputs(g, 2, 5, 8, 8, scale=8.0),
            label="large queries and keys: scores in the hundreds",
        ),
    ]


# ----------------------------------------------------------- Seq2SeqAttentionDecoderStep


def _step_inputs(g, vocab, hidden_dim, batch, n, scale=1.0):
    return (
        torch.randint(vocab, (batch,), generator=g),
        _randn(g, batch, hidden_dim, scale=0.5),
        _randn(g, batch, n, hidden_dim, scale=scale),
    )


def _decoder_step_cases(g):
    return [
        case(
            *_step_inputs(g, 11, 8, 3, 5),
            init=Init((11, 6, 8)),
            label="V=11, E=6, H=8, B=3, n=5",
        ),
        case(
            *_step_inputs(g, 7, 5, 2, 9),
            init=Init((7, 4, 5)),
            label="V=7, E=4, H=5, B=2, n=9",
        ),
        case(
            *_step_inputs(g, 13, 16, 4, 6, scale=0.5),
            init=Init((13, 16, 16)),
            label="E=H=16, B=4, n=6",
        ),
    ]


def _decoder_step_edge_cases(g):
    return [
        case(
            *_step_inputs(g, 9, 6, 3, 1),
            init=Init((9, 5, 6)),
            label="one encoder state (n=1): the fixed-context decoder",
        ),
        case(
            *_step_inputs(g, 9, 6, 1, 4),
            init=Init((9, 5, 6)),
            label="a batch of one",
        ),
        case(
            *_step_inputs(g, 9, 6, 2, 7, scale=80.0),
            init=Init((9, 5, 6)),
            label="large encoder states: scores in the hundreds",
        ),
    ]


TESTS = [
    HiddenTest(
        id="bn_softmax_values",
        exercise="softmax",
        points=2,
        description="softmax(x, dim) equals exp(x) / sum exp(x) along any dim, for any shape",
        make_cases=_softmax_values_cases,
        forbidden=("softmax",),
    ),
    HiddenTest(
        id="bn_softmax_stable",
        exercise="softmax",
        points=2,
        description="softmax stays finite and exact for logits of size 1000 and more",
        make_cases=_softmax_stable_cases,
        # rtol 1e-4: a correct x - logsumexp(x) loses ~1e-5 near x = 1000 in float32
        level="module",
        forbidden=("softmax",),
    ),
    HiddenTest(
        id="bn_attention_pool",
        exercise="attention_pool",
        points=2,
        description="context and weights of dot-product attention, for several shapes",
        make_cases=_attention_pool_cases,
        outputs=("context", "weights"),
    ),
    HiddenTest(
        id="bn_attention_pool_edge_cases",
        exercise="attention_pool",
        points=2,
        description="a single position, and scores too large for a naive softmax",
        make_cases=_attention_pool_edge_cases,
        outputs=("context", "weights"),
    ),
    HiddenTest(
        id="bn_decoder_step",
        exercise="Seq2SeqAttentionDecoderStep",
        points=3,
        description="one decoder step: attend with the previous state, update the GRU, predict",
        make_cases=_decoder_step_cases,
        level="module",
        outputs=("logits", "hidden", "weights"),
    ),
    HiddenTest(
        id="bn_decoder_step_edge_cases",
        exercise="Seq2SeqAttentionDecoderStep",
        points=1,
        description="the decoder step with one encoder state, a batch of one, and huge scores",
        make_cases=_decoder_step_edge_cases,
        level="module",
        outputs=("logits", "hidden", "weights"),
    ),
]


# ---------------------------------------------------------------- plausible wrong answers


def _softmax_naive(x, dim=-1):
    exp = x.exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def _softmax_ignores_dim(x, dim=-1):
    return ref.softmax(x, dim=-1)


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

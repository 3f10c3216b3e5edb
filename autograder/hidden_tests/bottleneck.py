"""Hidden tests for chapter 1, the bottleneck (12 points)."""

import torch

from autograder.grading.judging.spec import HiddenTest, Init, case
from autograder.hidden_tests._inputs import randn

# ------------------------------------------------------------------------------- softmax


def _softmax_values_cases(g):
    return [
        case(randn(g, 7), label="a vector"),
        case(randn(g, 3, 5), label="the rows of a matrix (default dim=-1)"),
        case(randn(g, 4, 4), dim=-1, label="a square matrix, dim=-1"),
        case(randn(g, 4, 4), dim=0, label="a square matrix, dim=0"),
        case(randn(g, 2, 5, 3), dim=1, label="the middle dimension of a 3-d tensor"),
        case(randn(g, 2, 3, 3), dim=-2, label="dim=-2"),
        case(torch.zeros(2, 6), label="equal logits"),
        case(randn(g, 5, 1), label="a dimension of size 1"),
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
            randn(g, 4, 6, scale=3.0) + offsets,
            label="rows at very different offsets (+1000, -1000, 0, +500)",
        ),
        case(
            randn(g, 5, 3, scale=200.0),
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
        randn(g, batch, d, scale=scale),
        randn(g, batch, n, d, scale=scale),
        randn(g, batch, n, d_v),
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
        randn(g, batch, hidden_dim, scale=0.5),
        randn(g, batch, n, hidden_dim, scale=scale),
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

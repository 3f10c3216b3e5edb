"""Hidden tests for chapter 6, the Transformer (23 points).

Exercise 0 asks for the student's own answers from chapters 3 to 5 (``causal_mask``,
``sinusoidal_encoding``, ``attention``, ``split_heads``, ``merge_heads``,
``MultiHeadAttention``): the student notebook holds no copy of them. Their chapters' hidden
tests run on them again here, for no points (their chapters grade them), so that the
feedback says early which pasted piece is wrong; every later exercise runs on them.
"""

import dataclasses
import math

import torch
from torch import nn

from autograder.grading.judging.spec import HiddenTest, Init, case, torch_layer
from autograder.hidden_tests import multi_head as _ch4
from autograder.hidden_tests import positional_encoding as _ch5
from autograder.hidden_tests import self_attention as _ch3
from autograder.hidden_tests._inputs import randn, random_mask


def _padding(lengths, n):
    """(B, 1, n) bool, True on the first lengths[b] keys (chapter 3's padding_mask)."""
    return (torch.arange(n) < torch.tensor(lengths)[:, None]).unsqueeze(1)


def _random_state(module, g):
    """A PyTorch layer's state drawn from g, layer norms included (not their 1 and 0)."""
    with torch.no_grad():
        for p in module.parameters():
            scale = 1 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _linear(g, d):
    """A random nn.Linear(d, d) as plain data: the sublayer a SublayerConnection wraps."""
    return torch_layer("Linear", d, d, state=_random_state(nn.Linear(d, d), g))


def _pair(g, batch, n, d):
    """Target sequences in pairs that agree everywhere but at the last position."""
    x = randn(g, batch, n, d)
    changed = x.clone()
    changed[:, -1] = randn(g, batch, d)
    return torch.cat([x, changed])  # (2 * batch, n, d)


# ------------------------------------------------------------------------------- cases


def _ffn_cases(g):
    return [
        case(randn(g, 2, 5, 8), init=Init((8, 32)), label="(2, 5, 8), d_ff = 32"),
        case(randn(g, 3, 1, 6), init=Init((6, 4)), label="length 1, d_ff < d_model"),
        case(randn(g, 7, 16), init=Init((16, 64)), label="no batch dimension"),
    ]


def _sublayer_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((8,), {"norm_first": norm_first})
        cases += [
            case(randn(g, 2, 5, 8), _linear(g, 8), init=init, label=name),
            case(randn(g, 1, 3, 8, scale=5.0), _linear(g, 8), init=init,
                 label=f"{name}, large inputs"),
        ]  # fmt: skip
    return cases


def _encoder_layer_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 4, 32), {"norm_first": norm_first})
        cases += [
            case(randn(g, 2, 5, 16), init=init, label=f"{name}, no mask"),
            case(randn(g, 3, 6, 16), mask=_padding([6, 4, 1], 6), init=init,
                 label=f"{name}, padding mask (B, 1, n)"),
            case(randn(g, 2, 5, 16), mask=random_mask(g, 2, 5, 5), init=init,
                 label=f"{name}, mask (B, n, n)"),
        ]  # fmt: skip
    return cases


def _torch_encoder_layer(g, d, h, d_ff, norm_first):
    layer = nn.TransformerEncoderLayer(
        d, h, dim_feedforward=d_ff, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    return torch_layer(
        "TransformerEncoderLayer", d, h, dim_feedforward=d_ff, dropout=0.0,
        batch_first=True, norm_first=norm_first, state=_random_state(layer, g),
    )  # fmt: skip


def _encoder_layer_torch_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 2, 24), {"norm_first": norm_first}, load_state=False)
        layer = _torch_encoder_layer(g, 16, 2, 24, norm_first)
        cases += [
            case(randn(g, 2, 5, 16), init=init, setup=[("load_torch_weights", (layer,))],
                 label=f"{name}, no mask"),
            case(randn(g, 3, 4, 16), mask=_padding([4, 2, 3], 4), init=init,
                 setup=[("load_torch_weights", (layer,))], label=f"{name}, padding mask"),
        ]  # fmt: skip
    return cases


def _decoder_layer_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 4, 32), {"norm_first": norm_first})
        cases += [
            case(randn(g, 2, 5, 16), randn(g, 2, 7, 16), init=init,
                 label=f"{name}, 5 targets, 7 sources, no masks"),
            case(randn(g, 3, 4, 16), randn(g, 3, 6, 16),
                 memory_mask=_padding([6, 3, 1], 6), init=init,
                 label=f"{name}, source padding mask"),
            case(randn(g, 3, 5, 16), randn(g, 3, 3, 16),
                 tgt_mask=_padding([5, 2, 4], 5), init=init,
                 label=f"{name}, target padding mask"),
        ]  # fmt: skip
    return cases


def _decoder_layer_causal_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 2, 32), {"norm_first": norm_first})
        memory = randn(g, 2, 6, 16)
        cases.append(
            case(_pair(g, 1, 6, 16), memory, init=init,
                 label=f"{name}, two targets that differ only in the last token"),
        )  # fmt: skip
    return cases


def _encoder_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 4, 32, 3), {"norm_first": norm_first})
        cases += [
            case(randn(g, 2, 5, 16), init=init, label=f"{name}, 3 layers"),
            case(randn(g, 3, 6, 16), mask=_padding([6, 2, 5], 6), init=init,
                 label=f"{name}, 3 layers, padding mask"),
        ]  # fmt: skip
    return cases


def _decoder_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((16, 4, 32, 3), {"norm_first": norm_first})
        cases += [
            case(_pair(g, 1, 5, 16), randn(g, 2, 4, 16), init=init,
                 label=f"{name}, two targets that differ only in the last token"),
            case(randn(g, 3, 5, 16), randn(g, 3, 6, 16),
                 tgt_mask=_padding([5, 3, 4], 5), memory_mask=_padding([6, 6, 2], 6),
                 init=init, label=f"{name}, target and source padding masks"),
        ]  # fmt: skip
    return cases


def _tokens(g, vocab, *shape):
    return torch.randint(vocab, shape, generator=g)


def _transformer_cases(g):
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((11, 13, 16, 4, 32, 2), {"norm_first": norm_first})
        cases += [
            case(_tokens(g, 11, 2, 7), _tokens(g, 13, 2, 5), init=init,
                 label=f"{name}, 7 source and 5 target tokens"),
            case(_tokens(g, 11, 3, 6), _tokens(g, 13, 3, 6),
                 src_mask=_padding([6, 3, 4], 6), init=init,
                 label=f"{name}, source padding mask"),
        ]  # fmt: skip
    return cases


def _greedy_cases(g):
    # Models with random weights often predict one token whatever the decoder reads; small
    # one-layer pre-norm models vary the most, so most cases use them, each with its own
    # weights, so that a decoder that never feeds its tokens back is caught.
    cases = []
    for norm_first in (False, True):
        name = "pre-norm" if norm_first else "post-norm"
        init = Init((9, 9, 16, 2, 32, 2), {"norm_first": norm_first})
        cases += [
            case(_tokens(g, 9, 3, 6), 6, 8, init=init, method="greedy_decode",
                 label=f"{name}, 6 tokens from 6"),
            case(_tokens(g, 9, 2, 4), 7, 0, src_mask=_padding([4, 2], 4), init=init,
                 method="greedy_decode", label=f"{name}, source padding mask"),
        ]  # fmt: skip
    small = Init((13, 13, 8, 2, 16, 1), {"norm_first": True})
    for i in range(3):
        cases.append(
            case(_tokens(g, 13, 4, 6), 6, 0, init=small, method="greedy_decode",
                 label=f"pre-norm, one layer, d_model = 8, model {i + 1}"),
        )  # fmt: skip
    return cases


# Round-off in a correct answer's logits is about 1e-6; a next-token choice closer than
# this is a near-tie the test must not depend on.
_GREEDY_MARGIN = 1e-3


def _decisive_greedy(model, c) -> bool:
    """Whether the reference decodes case ``c`` with every step's best token ahead of the
    second by at least ``_GREEDY_MARGIN`` (the steps of its greedy_decode, margins kept)."""
    src, max_len, bos = c.args
    src_mask = c.kwargs.get("src_mask")
    model.eval()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        ys = torch.full((src.size(0), 1), bos, dtype=torch.long)  # (B, 1)
        for _ in range(max_len):
            logits = model.decode(ys, memory, src_mask)[:, -1]  # (B, tgt_vocab)
            best, second = logits.topk(2, dim=-1).values.unbind(-1)  # (B,), (B,)
            if (best - second).min() < _GREEDY_MARGIN:
                return False
            ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], dim=1)  # (B, t + 1)
    return True


# The layers are built on the student's own chapter-4 attention: no PyTorch layer, no fused
# attention behind them.
_OWN_LAYERS = ("transformer_layer", "mha", "sdpa")


def _smoothing_cases(g):
    return [
        case(randn(g, 6, 5, scale=3.0), _tokens(g, 5, 6), 0.1, -100,
             label="(N, V) = (6, 5), smoothing 0.1"),
        case(randn(g, 8, 11), _tokens(g, 11, 8), 0.0, -100,
             label="smoothing 0: the plain cross-entropy"),
        case(randn(g, 5, 7), _tokens(g, 7, 5), 0.3, -100, label="smoothing 0.3"),
        case(randn(g, 4, 6, scale=40.0), _tokens(g, 6, 4), 0.1, -100,
             label="large logits (log_softmax, not the log of the softmax)"),
        case(randn(g, 2, 3, 9), _tokens(g, 9, 2, 3), 0.2, -100,
             label="(B, n, V) = (2, 3, 9) logits"),
    ]  # fmt: skip


def _smoothing_ignore_cases(g):
    cases = []
    for smoothing, ignore in ((0.1, 0), (0.25, 3)):
        target = _tokens(g, 8, 3, 5)
        target[0, 3:] = ignore
        target[2, 1:] = ignore
        target[1, 0] = (ignore + 1) % 8  # at least one target that counts
        cases.append(
            case(randn(g, 3, 5, 8, scale=2.0), target, smoothing, ignore,
                 label=f"(B, n, V) = (3, 5, 8), padding label {ignore} ignored"),
        )  # fmt: skip
    target = _tokens(g, 6, 7)
    target[[1, 4]] = -100
    cases.append(
        case(randn(g, 7, 6), target, 0.1, -100, label="(N, V), targets -100 ignored")
    )
    return cases


def _schedule_cases(g):
    return [
        case(
            step,
            d_model,
            warmup,
            label=f"step {step}, d_model {d_model}, warmup {warmup}",
        )
        for step, d_model, warmup in (
            (1, 512, 4000),
            (100, 512, 4000),
            (4000, 512, 4000),
            (25_000, 512, 4000),
            (3, 16, 10),
            (10, 16, 10),
            (40, 64, 10),
            (0, 64, 10),
        )
    ]


TESTS = [
    HiddenTest(
        id="ffn_values",
        exercise="PositionwiseFeedForward",
        points=1,
        description="linear2(relu(linear1(x))) on every position, for any leading dimensions",
        make_cases=_ffn_cases,
        level="module",
    ),
    HiddenTest(
        id="sublayer_connection",
        exercise="SublayerConnection",
        points=2,
        description="post-norm LayerNorm(x + sublayer(x)) and pre-norm x + sublayer(LayerNorm(x))",
        make_cases=_sublayer_cases,
        level="module",
    ),
    HiddenTest(
        id="encoder_layer_values",
        exercise="EncoderLayer",
        points=2,
        description="self-attention and feed-forward sublayers, post-norm and pre-norm, with masks (True = may attend)",
        make_cases=_encoder_layer_cases,
        level="module",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="encoder_layer_torch_weights",
        exercise="EncoderLayer",
        points=2,
        description="after load_torch_weights, the layer computes what nn.TransformerEncoderLayer does, in both norm placements",
        make_cases=_encoder_layer_torch_cases,
        level="module",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="decoder_layer_values",
        exercise="DecoderLayer",
        points=2,
        description="causal self-attention, cross-attention to the memory and feed-forward, with masks",
        make_cases=_decoder_layer_cases,
        level="module",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="decoder_layer_causal",
        exercise="DecoderLayer",
        points=1,
        description="changing a future target token leaves the earlier outputs unchanged",
        make_cases=_decoder_layer_causal_cases,
        level="module",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="encoder_stack",
        exercise="Encoder",
        points=2,
        description="num_layers encoder layers in order, with a final layer norm in pre-norm stacks",
        make_cases=_encoder_cases,
        level="model",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="decoder_stack",
        exercise="Decoder",
        points=2,
        description="num_layers causal decoder layers attending to the memory, with a final layer norm in pre-norm stacks",
        make_cases=_decoder_cases,
        level="model",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="transformer_forward",
        exercise="Transformer",
        points=2,
        description="scaled embeddings plus positions, encoder, decoder and output projection give the logits",
        make_cases=_transformer_cases,
        level="model",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="transformer_greedy_decode",
        exercise="Transformer",
        points=2,
        description="greedy_decode appends the most probable next token max_len times, from the start token",
        make_cases=_greedy_cases,
        decisive=_decisive_greedy,
        level="exact",
        forbidden=_OWN_LAYERS,
    ),
    HiddenTest(
        id="label_smoothing_values",
        exercise="label_smoothing_loss",
        points=2,
        description="(1 - eps) (-log p_y) + eps * mean over all V tokens of -log p_c, averaged, for (N, V) and (B, n, V) logits",
        make_cases=_smoothing_cases,
        level="op",
        forbidden=("cross_entropy",),
    ),
    HiddenTest(
        id="label_smoothing_ignore_index",
        exercise="label_smoothing_loss",
        points=1,
        description="targets equal to ignore_index count neither in the sum nor in the mean",
        make_cases=_smoothing_ignore_cases,
        level="op",
        forbidden=("cross_entropy",),
    ),
    HiddenTest(
        id="inverse_sqrt_schedule_values",
        exercise="inverse_sqrt_schedule",
        points=2,
        description="d_model^-0.5 min(step^-0.5, step warmup^-1.5), with step 0 taken as step 1",
        make_cases=_schedule_cases,
        level="op",
    ),
]


# Exercise 0: the student's own answers from chapters 3 to 5, checked again here.
EXERCISE_0 = (
    "causal_mask",
    "sinusoidal_encoding",
    "attention",
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
)


def _again(test: HiddenTest) -> HiddenTest:
    """An earlier chapter's hidden test, run on exercise 0's answers for no points."""
    return dataclasses.replace(
        test,
        id=f"ch6_{test.id}",
        points=0,
        description=f"{test.description} (no points here: its own chapter grades it)",
    )


TESTS = [
    _again(test)
    for module in (_ch3, _ch4, _ch5)
    for test in module.TESTS
    if test.exercise in EXERCISE_0
] + TESTS

"""Hidden tests for chapter 11, FlashAttention-2 in Triton (8 points).

The kernels run through Triton's interpreter (``TRITON_INTERPRET=1``) in the grader's
sealed child, on small shapes (n <= 48, widths 16 and 32, tiles of 16), so that a test
takes seconds on any machine. The interpreter computes ``tl.dot`` in float32 whatever
``input_precision`` says: TF32 cannot show here, and is graded only as far as its rounding
shows in the outputs (a known mistake rounds the inputs as a GPU would). Outputs and
gradients are held to FlashAttention's own rule (``tolerances.FLASH_RULE``): against
softmax attention computed in float64, an error at most twice what PyTorch's plain
float32 attention makes on the same inputs. The known mistakes are told apart at the
"module" tolerance against the reference kernels.
"""

import math

import torch

from autograder.grading.judging.spec import HiddenTest, case
from autograder.hidden_tests._inputs import randn


def softmax_attention(q, k, v, causal=False):
    """The yardstick: softmax attention in PyTorch's plain operations, in the inputs'
    dtype, with its log-sum-exp L (key j hidden from query i when j > i)."""
    logits = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(
        q.shape[-1]
    )  # (..., n_q, n_k)
    if causal:
        above = torch.ones(logits.shape[-2:], dtype=torch.bool).triu(diagonal=1)
        logits = logits.masked_fill(above, -math.inf)
    return torch.softmax(logits, dim=-1) @ v, logits.logsumexp(dim=-1)


class SoftmaxAttentionFunction:
    """The yardstick called as ``FlashAttentionTriton`` is: ``.apply(q, k, v, causal)``;
    autograd through it gives the gradients."""

    @staticmethod
    def apply(q, k, v, causal=False):
        return softmax_attention(q, k, v, causal)[0]


# batch, n_q, n_k, d, d_v, label: ragged lengths, n not a multiple of the tile of 16
SHAPES = [
    ((2,), 37, 45, 16, 16, "n_q = 37 != n_k = 45, neither a multiple of 16"),
    ((2,), 45, 21, 32, 16, "n_q = 45 > n_k = 21, d = 32 != d_v = 16"),
    ((1,), 7, 7, 16, 32, "one tile larger than n = 7, d_v = 32"),
    ((2,), 32, 32, 16, 16, "large logits (q and k times 3), n = 32: two whole tiles"),
]


def _qkv(g, batch, n_q, n_k, d, d_v, label):
    scale = 3.0 if label.startswith("large") else 1.0
    return (
        randn(g, *batch, n_q, d, scale=scale),
        randn(g, *batch, n_k, d, scale=scale),
        randn(g, *batch, n_k, d_v),
    )


def _forward_cases(g, causal):
    return [case(*_qkv(g, *shape), causal=causal, label=shape[-1]) for shape in SHAPES]


def _grad_cases(g, causal):
    cases = []
    for shape in SHAPES:
        q, k, v = _qkv(g, *shape)
        upstream = randn(g, *shape[0], shape[1], shape[4])
        cases.append(
            case(
                q, k, v, causal, method="apply", upstream_grad=upstream, label=shape[-1]
            )
        )
    return cases


TESTS = [
    HiddenTest(
        id="k_fwd",
        exercise="flash_attention_triton",
        points=2,
        description="flash_attention_triton: the output and the log-sum-exp L equal "
        "softmax attention's, for ragged lengths and n not a multiple of the tile",
        make_cases=lambda g: _forward_cases(g, causal=False),
        level="module",
        yardstick=softmax_attention,
        outputs=("out", "L"),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="k_fwd_causal",
        exercise="flash_attention_triton",
        points=2,
        description="flash_attention_triton with causal=True: the output and L equal "
        "causal softmax attention's (key j hidden from query i when j > i)",
        make_cases=lambda g: _forward_cases(g, causal=True),
        level="module",
        yardstick=softmax_attention,
        outputs=("out", "L"),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="k_bwd",
        exercise="FlashAttentionTriton",
        points=2,
        description="FlashAttentionTriton.apply: the output and the gradients dq, dk, dv "
        "for a given upstream gradient equal softmax attention's",
        make_cases=lambda g: _grad_cases(g, causal=False),
        level="module",
        yardstick=SoftmaxAttentionFunction,
        outputs=("out", "dq", "dk", "dv"),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="k_bwd_causal",
        exercise="FlashAttentionTriton",
        points=2,
        description="FlashAttentionTriton.apply with causal=True: the output and the "
        "gradients equal causal softmax attention's, ragged lengths included",
        make_cases=lambda g: _grad_cases(g, causal=True),
        level="module",
        yardstick=SoftmaxAttentionFunction,
        outputs=("out", "dq", "dk", "dv"),
        forbidden=("sdpa", "softmax"),
    ),
]

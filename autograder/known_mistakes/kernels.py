"""Known mistakes of chapter 11's Triton kernels: plausible wrong answers that every hidden
test of their exercise must fail, each with the hint the feedback gives.

The slips are chapter 8's (``_flash_slips``): a kernel that makes one computes the same
numbers as chapter 8's tiled PyTorch function with the same slip and tiles of 16, the
kernels' tile in the interpreter, so the wrong functions are reused from there rather than
written again in Triton. TF32 is the one slip of this chapter's own: the interpreter
computes ``tl.dot`` in float32 whatever ``input_precision`` says, so the mistake rounds
the inputs to TF32 as a GPU's tensor cores read them (``round_to_tf32``) and then computes
as a right answer would (chapter 8's function without a slip: the mistakes stay out of
the interpreter, which is slow).
"""

import torch

from autograder.grading.judging.spec import Mistake
from autograder.known_mistakes._flash_slips import SLIPS, wrong_flash_function
from solutions import kernels as ref

TILE = 16  # the reference's tile in the interpreter


class _SavedTensors:
    """Stands in for autograd's ctx to read what a forward saves (L is the last)."""

    def save_for_backward(self, *tensors):
        self.saved = tensors


def _wrong_forward(**slips):
    """flash_attention_triton(q, k, v, causal) -> (out, L) with one of the forward's slips."""
    function = wrong_flash_function(**slips)

    def flash_attention_triton(q, k, v, causal=False):
        ctx = _SavedTensors()
        with torch.no_grad():
            out = function.forward(ctx, q, k, v, causal, TILE)
        return out, ctx.saved[-1]

    return flash_attention_triton


def _wrong_function(**slips):
    """FlashAttentionTriton with one slip: ``apply(q, k, v, causal)``."""
    function = wrong_flash_function(**slips)

    class FlashAttentionTriton:
        @staticmethod
        def apply(q, k, v, causal=False):
            return function.apply(q, k, v, causal, TILE)

    return FlashAttentionTriton


def _tf32(x):
    """x with its value rounded to TF32 and its gradient passed through unchanged."""
    return x + (ref.round_to_tf32(x) - x).detach()


_RIGHT_FORWARD, _RIGHT_FUNCTION = _wrong_forward(), _wrong_function()  # no slip


def _forward_tf32(q, k, v, causal=False):
    return _RIGHT_FORWARD(_tf32(q), _tf32(k), _tf32(v), causal)


class _FunctionTF32:
    @staticmethod
    def apply(q, k, v, causal=False):
        return _RIGHT_FUNCTION.apply(_tf32(q), _tf32(k), _tf32(v), causal)


TF32 = (
    "TF32 where float32 was meant",
    "your outputs are off by about 1e-3, as if the inputs of tl.dot were rounded to TF32's "
    "10 mantissa bits: on a GPU, tl.dot on float32 uses TF32 unless it is given "
    'input_precision="ieee".',
)

FORWARD_SLIPS = [s for s in SLIPS if s[2].keys() & {"rescale_sum", "lse_with_max"}]

MISTAKES = [
    Mistake("flash_attention_triton", name, hint, _wrong_forward(**slips))
    for name, hint, slips in FORWARD_SLIPS
]
MISTAKES.append(Mistake("flash_attention_triton", *TF32, _forward_tf32))
MISTAKES += [
    Mistake("FlashAttentionTriton", name, hint, _wrong_function(**slips))
    for name, hint, slips in SLIPS
]
MISTAKES.append(Mistake("FlashAttentionTriton", *TF32, _FunctionTF32))

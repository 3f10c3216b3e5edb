"""Known mistakes of chapter 11's Triton kernels: plausible wrong answers that every hidden
test of their exercise must fail, each with the hint the feedback gives. A kernel's are
functions of its launcher's arguments (``probe.LAUNCHERS``), called directly by the
grader: what a kernel with the slip computes.

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

    def flash_attention_triton(q, k, v, causal=False, tile=TILE):
        ctx = _SavedTensors()
        with torch.no_grad():
            out = function.forward(ctx, q, k, v, causal, tile)
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
# the backward kernels are given L and D: only these slips are theirs
DKDV_SLIPS = [s for s in SLIPS if s[2].keys() & {"scale_grads", "causal_start"}]
DQ_SLIPS = [s for s in SLIPS if s[2].keys() & {"scale_grads"}]


# The kernels' mistakes are functions of the launcher's arguments (``probe.LAUNCHERS``),
# flat (BH, n, d) buffers: what a kernel with the slip computes. The keys no query can
# see, which the causal tests fill with NaN, are set to 0 first: a kernel with one of
# these slips but the right loop bound never reads them.
def _clean(k, v):
    return k.nan_to_num(0.0), v.nan_to_num(0.0)


def _kernel_forward(**slips):
    """flash_fwd_kernel with one slip: (out, L)."""
    forward = _wrong_forward(**slips)

    def launched(q, k, v, causal=False, block_q=TILE, block_k=TILE):
        return forward(q, *_clean(k, v), causal, block_q)

    return launched


def _kernel_gradients(slips, q, k, v, do, causal, tiles):
    """dq, dk, dv of a FlashAttention with one slip, by its own backward."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, *_clean(k, v)))
    with torch.enable_grad():
        out = wrong_flash_function(**slips).apply(q, k, v, causal, tiles)
        return torch.autograd.grad(out, (q, k, v), do)


def _kernel_backward(pick, tf32=False, **slips):
    """A backward kernel with one slip (or its inputs rounded to TF32): ``pick`` of
    (dq, dk, dv), the gradients that kernel stores."""

    def launched(q, k, v, do, lse, delta, causal=False, block_q=TILE, block_k=TILE):
        if tf32:
            q, k, v, do = (ref.round_to_tf32(x) for x in (q, k, v, do))
        return pick(_kernel_gradients(slips, q, k, v, do, causal, block_q))

    return launched


def _kernel_dkdv(tf32=False, **slips):
    """flash_bwd_dkdv_kernel with one slip: [dk, dv]."""
    return _kernel_backward(lambda grads: list(grads[1:]), tf32, **slips)


def _kernel_dq(tf32=False, **slips):
    """flash_bwd_dq_kernel with one slip: dq."""
    return _kernel_backward(lambda grads: grads[0], tf32, **slips)


def _kernel_forward_tf32(q, k, v, causal=False, block_q=TILE, block_k=TILE):
    return _forward_tf32(q, *_clean(k, v), causal)


def _unseen(k, causal):
    """The keys a causal kernel with the right bound never reads (NaN in the tests)."""
    return causal and bool(k.isnan().any())


def _forward_without_bound(q, k, v, causal=False, block_q=TILE, block_k=TILE):
    """Loads every key tile and masks it: the NaN keys reach every output row."""
    out, lse = _kernel_forward()(q, k, v, causal)
    return (out.fill_(float("nan")) if _unseen(k, causal) else out), lse


def _dkdv_without_bound(
    q, k, v, do, lse, delta, causal=False, block_q=TILE, block_k=TILE
):
    """Every key tile loops over every query tile: the NaN keys' dK is NaN."""
    dk, dv = _kernel_dkdv()(q, k, v, do, lse, delta, causal, block_q, block_k)
    if _unseen(k, causal):
        dk[k.isnan().any(-1)] = float("nan")
    return [dk, dv]


def _dq_without_bound(
    q, k, v, do, lse, delta, causal=False, block_q=TILE, block_k=TILE
):
    """Every query tile loops over every key tile: the NaN values reach every row."""
    dq = _kernel_dq()(q, k, v, do, lse, delta, causal, block_q, block_k)
    return dq.fill_(float("nan")) if _unseen(k, causal) else dq


NO_BOUND = (
    "key tiles past the causal bound loaded",
    "with causal=True, your kernel reads key tiles that no query of its tile can see: "
    "the test filled those keys and values with NaN, and they reached your output. "
    "Masking a tile's scores does not stop its values from entering the sums: stop the "
    "loop before the first key tile that starts at or after (tile + 1) * BLOCK_Q (and "
    "start dK and dV's loop at the query tile that holds the key tile's first key).",
)

MISTAKES = [
    Mistake("flash_fwd_kernel", name, hint, _kernel_forward(**slips))
    for name, hint, slips in FORWARD_SLIPS
]
MISTAKES += [
    Mistake("flash_fwd_kernel", *TF32, _kernel_forward_tf32),
    Mistake("flash_fwd_kernel", *NO_BOUND, _forward_without_bound),
]
MISTAKES += [
    Mistake("flash_bwd_dkdv_kernel", name, hint, _kernel_dkdv(**slips))
    for name, hint, slips in DKDV_SLIPS
]
MISTAKES += [
    Mistake("flash_bwd_dkdv_kernel", *TF32, _kernel_dkdv(tf32=True)),
    Mistake("flash_bwd_dkdv_kernel", *NO_BOUND, _dkdv_without_bound),
]
MISTAKES += [
    Mistake("flash_bwd_dq_kernel", name, hint, _kernel_dq(**slips))
    for name, hint, slips in DQ_SLIPS
]
MISTAKES += [
    Mistake("flash_bwd_dq_kernel", *TF32, _kernel_dq(tf32=True)),
    Mistake("flash_bwd_dq_kernel", *NO_BOUND, _dq_without_bound),
]
MISTAKES += [
    Mistake("flash_attention_triton", name, hint, _wrong_forward(**slips))
    for name, hint, slips in FORWARD_SLIPS
]
MISTAKES.append(Mistake("flash_attention_triton", *TF32, _forward_tf32))
MISTAKES += [
    Mistake("FlashAttentionTriton", name, hint, _wrong_function(**slips))
    for name, hint, slips in SLIPS
]
MISTAKES.append(Mistake("FlashAttentionTriton", *TF32, _FunctionTF32))

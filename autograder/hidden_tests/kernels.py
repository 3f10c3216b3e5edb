"""Hidden tests for chapter 11, FlashAttention-2 in Triton (10 points).

Eight points are the kernels'. Each kernel test launches the notebook's own ``@triton.jit``
kernel (``flash_fwd_kernel``, ``flash_bwd_dkdv_kernel``, ``flash_bwd_dq_kernel``) with the
course's launcher (``probe.LAUNCHERS``), by the signature the chapter documents, on flat
buffers the test made and with the tiles it chose (16 or 32, the same for queries and
keys): never through the notebook's wrappers, so a wrapper computed without the kernels
earns none of them. The wrappers, ``flash_attention_triton`` and ``FlashAttentionTriton``,
have a point each.

The causal loop bound is graded: where a causal query tile can never see a key tile
(keys at or past n_q, rounded up to a whole tile, when n_k > n_q), the test fills those
keys and values with NaN. A kernel that stops where the chapter says never loads them; one
that loads every tile and masks it brings NaN into its output.

The kernels run through Triton's interpreter (``TRITON_INTERPRET=1``) in the grader's
sealed child, on small shapes (n <= 53, widths 16 and 32), so that a test takes seconds on
any machine. The interpreter computes ``tl.dot`` in float32 whatever ``input_precision``
says: TF32 cannot show here, and is graded only as far as its rounding shows in the
outputs (a known mistake rounds the inputs as a GPU would). Outputs and gradients are held
to the course's form of FlashAttention's rule (``tolerances.FLASH_RULE``): against softmax
attention computed in float64, an error at most a few times what PyTorch's plain float32
attention makes on the same inputs (four times for outputs and L, twenty for gradients),
plus 1e-6. The known mistakes are told apart at the "module" tolerance against the
reference kernels.
"""

import math

import torch

from autograder.grading.judging.spec import HiddenTest, case
from autograder.hidden_tests._inputs import randn


def _seen(k, v, n_q, causal):
    """k and v with the keys no query can see (j >= n_q, causal) set to 0: the tests fill
    them with NaN, which a right answer never reads."""
    if not causal or k.size(-2) <= n_q:
        return k, v
    seen = (torch.arange(k.size(-2)) < n_q)[:, None]  # (n_k, 1)
    return torch.where(seen, k, 0.0), torch.where(seen, v, 0.0)


def softmax_attention(q, k, v, causal=False):
    """The yardstick: softmax attention in PyTorch's plain operations, in the inputs'
    dtype, with its log-sum-exp L (key j hidden from query i when j > i)."""
    k, v = _seen(k, v, q.size(-2), causal)
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


def launched_forward(q, k, v, causal=False, block_q=16, block_k=16):
    """The yardstick of ``flash_fwd_kernel``, called with its launcher's arguments."""
    return softmax_attention(q, k, v, causal)


def _gradients(q, k, v, do, causal):
    """dq, dk, dv of sum(softmax attention * do), by autograd."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with torch.enable_grad():
        out = softmax_attention(q, k, v, causal)[0]
        return torch.autograd.grad(out, (q, k, v), do)


def launched_dkdv(q, k, v, do, lse, delta, causal=False, block_q=16, block_k=16):
    """The yardstick of ``flash_bwd_dkdv_kernel``: (dk, dv)."""
    return list(_gradients(q, k, v, do, causal)[1:])


def launched_dq(q, k, v, do, lse, delta, causal=False, block_q=16, block_k=16):
    """The yardstick of ``flash_bwd_dq_kernel``: dq."""
    return _gradients(q, k, v, do, causal)[0]


# batch, n_q, n_k, d, d_v, label: ragged lengths, n not a multiple of the tile of 16
SHAPES = [
    ((2,), 37, 45, 16, 16, "n_q = 37 != n_k = 45, neither a multiple of 16"),
    ((2,), 45, 21, 32, 16, "n_q = 45 > n_k = 21, d = 32 != d_v = 16"),
    ((1,), 7, 7, 16, 32, "one tile larger than n = 7, d_v = 32"),
    ((2,), 32, 32, 16, 16, "large logits (q and k times 3), n = 32: two whole tiles"),
]
# For the kernels: BH, n_q, n_k, d, d_v, tile (BLOCK_Q = BLOCK_K), label
KERNEL_SHAPES = [
    (2, 37, 45, 16, 16, 16, "n_q = 37 != n_k = 45, tiles of 16"),
    (2, 45, 21, 32, 16, 16, "n_q = 45 > n_k = 21, d = 32 != d_v = 16, tiles of 16"),
    (1, 7, 7, 16, 32, 16, "one tile larger than n = 7, d_v = 32"),
    (1, 21, 53, 16, 16, 16, "n_q = 21 < n_k = 53, tiles of 16"),
    (2, 21, 53, 16, 16, 32, "n_q = 21 < n_k = 53, tiles of 32"),
    (2, 32, 32, 16, 16, 16, "large logits (q and k times 3), two whole tiles of 16"),
]


def _qkv(g, batch, n_q, n_k, d, d_v, label):
    scale = 3.0 if label.startswith("large") else 1.0
    return (
        randn(g, *batch, n_q, d, scale=scale),
        randn(g, *batch, n_k, d, scale=scale),
        randn(g, *batch, n_k, d_v),
    )


def _poisoned(k, v, n_q, tile, causal):
    """With ``causal``, the keys of the tiles no query tile can see (from n_q rounded up
    to whole tiles) filled with NaN; the label's note, or "" when there are none."""
    unseen = -(-n_q // tile) * tile
    if not causal or unseen >= k.size(-2):
        return k, v, ""
    k, v = k.clone(), v.clone()
    k[..., unseen:, :] = v[..., unseen:, :] = math.nan
    return k, v, f"; keys from {unseen} on, which no query sees, are NaN"


def _kernel_inputs(g, causal, heads, n_q, n_k, d, d_v, tile, label):
    """The launcher's buffers: q, k, v, and for the backward dO with the forward's L and
    D = rowsum(dO * O), computed exactly (float64) and rounded to float32."""
    q, k, v = _qkv(g, (heads,), n_q, n_k, d, d_v, label)
    do = randn(g, heads, n_q, d_v)
    out, lse = softmax_attention(q.double(), k.double(), v.double(), causal)
    delta = (do.double() * out).sum(-1)
    k, v, note = _poisoned(k, v, n_q, tile, causal)
    blocks = dict(causal=causal, block_q=tile, block_k=tile)
    return (q, k, v), (do, lse.float(), delta.float()), blocks, label + note


def _forward_kernel_cases(g, causal):
    cases = []
    for shape in KERNEL_SHAPES:
        qkv, _, blocks, label = _kernel_inputs(g, causal, *shape)
        cases.append(case(*qkv, launch="forward", label=label, **blocks))
    return cases


def _backward_kernel_cases(g, launch):
    cases = []
    for shape in KERNEL_SHAPES:
        causal = shape[2] > shape[1]  # n_k > n_q: causal, and some key tiles unseen
        qkv, grads, blocks, label = _kernel_inputs(g, causal, *shape)
        label = ("causal, " if causal else "") + label
        cases.append(case(*qkv, *grads, launch=launch, label=label, **blocks))
    return cases


def _forward_cases(g):
    return [
        case(*_qkv(g, *shape), causal=i % 2 == 1, label=shape[-1])
        for i, shape in enumerate(SHAPES)
    ]


def _grad_cases(g):
    cases = []
    for i, shape in enumerate(SHAPES):
        q, k, v = _qkv(g, *shape)
        upstream = randn(g, *shape[0], shape[1], shape[4])
        causal = i % 2 == 0
        cases.append(
            case(
                q, k, v, causal, method="apply", upstream_grad=upstream, label=shape[-1]
            )
        )
    return cases


TESTS = [
    HiddenTest(
        id="k_fwd_kernel",
        exercise="flash_fwd_kernel",
        points=2,
        description="flash_fwd_kernel, launched by the course on its own buffers: the "
        "output and the log-sum-exp L equal softmax attention's, for ragged lengths, n "
        "not a multiple of the tile, tiles of 16 and 32",
        make_cases=lambda g: _forward_kernel_cases(g, causal=False),
        level="module",
        yardstick=launched_forward,
        outputs=("out", "L"),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="k_fwd_kernel_causal",
        exercise="flash_fwd_kernel",
        points=2,
        description="flash_fwd_kernel with CAUSAL: the output and L equal causal softmax "
        "attention's (key j hidden from query i when j > i), and the loop stops before "
        "the key tiles no query of the tile can see (the test fills them with NaN)",
        make_cases=lambda g: _forward_kernel_cases(g, causal=True),
        level="module",
        yardstick=launched_forward,
        outputs=("out", "L"),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="k_dkdv_kernel",
        exercise="flash_bwd_dkdv_kernel",
        points=2,
        description="flash_bwd_dkdv_kernel, launched by the course with the forward's L "
        "and D: dK and dV equal softmax attention's, causal and not, ragged lengths "
        "included, and with CAUSAL the loop starts at the query tile of the diagonal",
        make_cases=lambda g: _backward_kernel_cases(g, "dkdv"),
        level="module",
        yardstick=launched_dkdv,
        outputs=("dk", "dv"),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="k_dq_kernel",
        exercise="flash_bwd_dq_kernel",
        points=2,
        description="flash_bwd_dq_kernel, launched by the course with the forward's L and "
        "D: dQ equals softmax attention's, causal and not, ragged lengths included, and "
        "with CAUSAL the loop stops where the forward's does",
        make_cases=lambda g: _backward_kernel_cases(g, "dq"),
        level="module",
        yardstick=launched_dq,
        outputs=("dq",),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="k_wrapper",
        exercise="flash_attention_triton",
        points=1,
        description="flash_attention_triton: the output and L equal softmax attention's, "
        "causal and not, with any leading batch dimensions",
        make_cases=_forward_cases,
        level="module",
        yardstick=softmax_attention,
        outputs=("out", "L"),
        forbidden=("sdpa", "softmax"),
    ),
    HiddenTest(
        id="k_function",
        exercise="FlashAttentionTriton",
        points=1,
        description="FlashAttentionTriton.apply: the output and the gradients dq, dk, dv "
        "for a given upstream gradient equal softmax attention's, causal and not",
        make_cases=_grad_cases,
        level="module",
        yardstick=SoftmaxAttentionFunction,
        outputs=("out", "dq", "dk", "dv"),
        forbidden=("sdpa", "softmax"),
    ),
]

"""Chapter 11's reference kernels (``solutions/kernels.py``), run through Triton's
interpreter on the CPU: the forward returns chapter 8's output and log-sum-exp, the
backward chapter 8's gradients, and the interpreter runs in a sealed process as the
grader's child is (no new machine code after the seal)."""

import os
import subprocess
import sys

import pytest
import torch

from autograder import paths
from solutions import efficient_attention as ea
from solutions import kernels

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the interpreter's tests are for machines without a GPU",
)

CASES = [  # batch, n_q, n_k, d, d_v, causal: ragged lengths, several tiles of 16
    ((2, 2), 40, 40, 16, 16, False),
    ((2,), 37, 53, 32, 16, False),
    ((2,), 37, 53, 32, 16, True),
    ((1,), 53, 20, 16, 32, True),
    ((2,), 16, 16, 16, 16, True),
]


def _inputs(batch, n_q, n_k, d, d_v, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(*batch, n, d, generator=g) for n in (n_q, n_k))
    v = torch.randn(*batch, n_k, d_v, generator=g)
    return q, k, v, torch.randn(*batch, n_q, d_v, generator=g)


def _grads(attend, q, k, v, d_out):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = attend(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), d_out))


def test_the_interpreter_is_on_only_without_a_gpu():
    assert os.environ.get("TRITON_INTERPRET") == "1"
    # a fresh process that sees a GPU leaves the variable alone (the chapter's first cell
    # does the same before it imports triton)
    code = (
        "import os, torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "import solutions.kernels\n"
        "print(os.environ.get('TRITON_INTERPRET'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=paths.REPO, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "None"


@pytest.mark.parametrize("batch, n_q, n_k, d, d_v, causal", CASES)
def test_the_forward_kernel_returns_chapter_8s_output_and_lse(
    batch, n_q, n_k, d, d_v, causal
):
    q, k, v, _ = _inputs(batch, n_q, n_k, d, d_v)
    out, lse = kernels.flash_attention_triton(q, k, v, causal)
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = q64 @ k64.transpose(-2, -1) / d**0.5
    if causal:
        mask = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    expected_lse = torch.logsumexp(scores, -1)
    expected = torch.softmax(scores, -1) @ v64
    # FlashAttention's rule: at most a small multiple of PyTorch's own float32 error
    torch32 = ea.flash_attention(q, k, v, 16, causal).double()
    allowed = 2 * (torch32 - expected).abs().max() + 1e-6
    assert (out.double() - expected).abs().max() <= allowed
    assert (lse.double() - expected_lse).abs().max() <= 1e-5
    assert out.shape == (*batch, n_q, d_v) and lse.shape == (*batch, n_q)


@pytest.mark.parametrize("batch, n_q, n_k, d, d_v, causal", CASES)
def test_the_backward_kernels_return_chapter_8s_gradients(
    batch, n_q, n_k, d, d_v, causal
):
    q, k, v, d_out = _inputs(batch, n_q, n_k, d, d_v, seed=1)
    got = _grads(
        lambda q, k, v: kernels.FlashAttentionTriton.apply(q, k, v, causal),
        q,
        k,
        v,
        d_out,
    )
    chapter_8 = _grads(
        lambda q, k, v: ea.flash_attention_autograd(q, k, v, causal, 16), q, k, v, d_out
    )
    exact = _grads(
        lambda q, k, v: ea.flash_attention_autograd(q, k, v, causal, 16),
        *(x.double() for x in (q, k, v, d_out)),
    )
    for name, g, c, e in zip(
        ("out", "dq", "dk", "dv"), got, chapter_8, exact, strict=True
    ):
        allowed = (
            2 * (c.double() - e).abs().max() + 1e-6
        )  # chapter 8's own float32 error
        assert (g.double() - e).abs().max() <= allowed, name


def test_widths_the_kernels_cannot_tile_are_refused():
    q, k, v, _ = _inputs((1,), 8, 8, 12, 16)
    with pytest.raises(ValueError, match="power of two"):
        kernels.flash_attention_triton(q, k, v)


def test_tl_dot_rounds_to_tf32_only_where_asked_on_a_gpu_not_in_the_interpreter():
    """What the chapter says of the float32 pitfall: the interpreter computes tl.dot in
    float32 whatever input_precision says, so TF32 cannot be told apart here."""
    import triton
    import triton.language as tl

    @triton.jit
    def product(a_ptr, b_ptr, c_ptr, N: tl.constexpr, PRECISION: tl.constexpr):
        r = tl.arange(0, N)
        a = tl.load(a_ptr + r[:, None] * N + r[None, :])
        b = tl.load(b_ptr + r[:, None] * N + r[None, :])
        tl.store(
            c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b, input_precision=PRECISION)
        )

    a, b = torch.randn(16, 16), torch.randn(16, 16)
    results = {}
    for precision in ("ieee", "tf32"):
        c = torch.empty(16, 16)
        product[(1,)](a, b, c, 16, precision)
        results[precision] = c
    torch.testing.assert_close(results["ieee"], a @ b)
    assert torch.equal(results["ieee"], results["tf32"])


def test_tf32_rounding_keeps_ten_mantissa_bits_and_costs_far_more_than_float32():
    x = torch.tensor([1.0, 1.0 + 2**-10, 1.0 + 2**-11 + 2**-13, 1.0 + 2**-12, -3.0])
    assert kernels.round_to_tf32(x).tolist() == [
        1.0,
        1.0 + 2**-10,
        1.0 + 2**-10,
        1.0,
        -3.0,
    ]
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    exact = a.double() @ b.double()
    float32 = (a @ b - exact).abs().max()
    tf32 = (kernels.round_to_tf32(a) @ kernels.round_to_tf32(b) - exact).abs().max()
    assert tf32 > 100 * float32  # far outside FlashAttention's tolerance rule


def test_the_interpreter_runs_in_a_sealed_process():
    """The grader's sealed child may not map executable memory: Triton, imported before
    the seal (in the student's cells), still runs the kernels through its interpreter."""
    code = (
        "import os, torch\n"
        "from solutions import kernels\n"
        "from autograder.grading.sealed import probe\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    status = 1\n"
        "    try:\n"
        "        torch.set_num_threads(1)\n"
        "        probe.seal()\n"
        "        q = torch.randn(2, 37, 16, requires_grad=True)\n"
        "        out = kernels.FlashAttentionTriton.apply(q, q.detach(), q.detach(), True)\n"
        "        (grad,) = torch.autograd.grad(out.sum(), [q])\n"
        "        status = 0 if torch.isfinite(grad).all() else 2\n"
        "    finally:\n"
        "        os._exit(status)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=paths.REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "0"

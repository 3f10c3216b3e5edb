"""Chapter 11's reference kernels (``solutions/kernels.py``), run through Triton's
interpreter on the CPU: the forward returns chapter 8's output and log-sum-exp, the
backward chapter 8's gradients, and the interpreter runs in a sealed process as the
grader's child is (no new machine code after the seal)."""

import os

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
    run = run_python(code, timeout=120, env=env)
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
    run = run_python(code)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "0"


# ---------------------------------------------------------------- tests of the hidden tests
# An implementation written from chapter 11's text, not from the reference: query tiles of
# 32 and key tiles of 16 (the reference tiles both by 16), the scores masked before the
# scale, base-2 exponentials, the log-sum-exp kept as log2 until the end, and dK/dV and dQ
# from kernels arranged differently. Two flags make it wrong in ways outside the mistake
# catalogue: the diagonal hidden by the causal mask (j >= i), and keys past n_k left
# unmasked (read as zeros, so they score 0).

import math as _math  # noqa: E402

import triton  # noqa: E402  (solutions.kernels, imported above, chose the interpreter)
import triton.language as tl  # noqa: E402

from autograder.grading.judging.spec import load_chapter_tests  # noqa: E402
from tests.answers import verdicts  # noqa: E402
from tests.notebooks import run_python  # noqa: E402

_LOG2E = 1.4426950408889634


@triton.jit
def _indep_fwd(
    Q, K, V, Out, LSE, n_q, n_k, sm_scale,
    D: tl.constexpr, DV: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
    CAUSAL: tl.constexpr, HIDE_DIAGONAL: tl.constexpr = False,
    MASK_KEYS: tl.constexpr = True, BOUND: tl.constexpr = True,
):  # fmt: skip
    pid_q, z = tl.program_id(0), tl.program_id(1)
    i = pid_q * BQ + tl.arange(0, BQ)
    c, cv = tl.arange(0, D), tl.arange(0, DV)
    q = tl.load(
        Q + z * n_q * D + i[:, None] * D + c[None, :], mask=i[:, None] < n_q, other=0.0
    )
    run_max = tl.zeros((BQ,), tl.float32) - float("inf")
    run_sum = tl.zeros((BQ,), tl.float32)
    o = tl.zeros((BQ, DV), tl.float32)
    end = n_k
    if CAUSAL:
        if BOUND:
            end = tl.minimum(n_k, pid_q * BQ + BQ)
    for j0 in range(0, end, BK):
        j = j0 + tl.arange(0, BK)
        kt = tl.load(
            K + z * n_k * D + j[None, :] * D + c[:, None],
            mask=j[None, :] < n_k,
            other=0.0,
        )
        s = tl.dot(q, kt, input_precision="ieee")  # (BQ, BK), unscaled
        keep = tl.full((BQ, BK), 1, tl.int1)
        if MASK_KEYS:
            keep = keep & (j[None, :] < n_k)
        if CAUSAL:
            if HIDE_DIAGONAL:
                keep = keep & (j[None, :] < i[:, None])
            else:
                keep = keep & (j[None, :] <= i[:, None])
        s = tl.where(
            keep, s * (sm_scale * 1.4426950408889634), float("-inf")
        )  # log2 units
        new_max = tl.maximum(run_max, tl.max(s, axis=1))
        new_max = tl.where(
            new_max == float("-inf"), 0.0, new_max
        )  # a row with no key yet
        p = tl.exp2(s - new_max[:, None])
        shrink = tl.exp2(run_max - new_max)
        run_sum = run_sum * shrink + tl.sum(p, axis=1)
        vt = tl.load(
            V + z * n_k * DV + j[:, None] * DV + cv[None, :],
            mask=j[:, None] < n_k,
            other=0.0,
        )
        o = o * shrink[:, None] + tl.dot(p, vt, input_precision="ieee")
        run_max = new_max
    ok = i < n_q
    tl.store(
        Out + z * n_q * DV + i[:, None] * DV + cv[None, :],
        o / run_sum[:, None],
        mask=ok[:, None],
    )
    # log2-sum-exp2 back to natural units: L = (m + log2 l) / log2(e)
    tl.store(
        LSE + z * n_q + i, (run_max + tl.log2(run_sum)) / 1.4426950408889634, mask=ok
    )


@triton.jit
def _indep_bwd_kv(
    Q, K, V, DO, LSE, DELTA, DK, DV_, n_q, n_k, sm_scale,
    D: tl.constexpr, DV: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
    CAUSAL: tl.constexpr, BOUND: tl.constexpr = True,
):  # fmt: skip
    pid_k, z = tl.program_id(0), tl.program_id(1)
    j = pid_k * BK + tl.arange(0, BK)
    c, cv = tl.arange(0, D), tl.arange(0, DV)
    k = tl.load(
        K + z * n_k * D + j[:, None] * D + c[None, :], mask=j[:, None] < n_k, other=0.0
    )
    v = tl.load(
        V + z * n_k * DV + j[:, None] * DV + cv[None, :],
        mask=j[:, None] < n_k,
        other=0.0,
    )
    dk = tl.zeros((BK, D), tl.float32)
    dv = tl.zeros((BK, DV), tl.float32)
    first = 0
    if CAUSAL:
        if BOUND:
            first = (pid_k * BK) // BQ * BQ  # the query tile holding key j0
    for i0 in range(first, n_q, BQ):
        i = i0 + tl.arange(0, BQ)
        row = i < n_q
        q = tl.load(
            Q + z * n_q * D + i[:, None] * D + c[None, :], mask=row[:, None], other=0.0
        )
        do = tl.load(
            DO + z * n_q * DV + i[:, None] * DV + cv[None, :],
            mask=row[:, None],
            other=0.0,
        )
        lse = tl.load(LSE + z * n_q + i, mask=row, other=0.0)
        delta = tl.load(DELTA + z * n_q + i, mask=row, other=0.0)
        keep = row[:, None] & (j[None, :] < n_k)
        if CAUSAL:
            keep = keep & (j[None, :] <= i[:, None])
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None]) * sm_scale
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
    tl.store(DK + z * n_k * D + j[:, None] * D + c[None, :], dk, mask=j[:, None] < n_k)
    tl.store(
        DV_ + z * n_k * DV + j[:, None] * DV + cv[None, :], dv, mask=j[:, None] < n_k
    )


@triton.jit
def _indep_bwd_q(
    Q, K, V, DO, LSE, DELTA, DQ, n_q, n_k, sm_scale,
    D: tl.constexpr, DV: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
    CAUSAL: tl.constexpr, BOUND: tl.constexpr = True,
):  # fmt: skip
    pid_q, z = tl.program_id(0), tl.program_id(1)
    i = pid_q * BQ + tl.arange(0, BQ)
    c, cv = tl.arange(0, D), tl.arange(0, DV)
    row = i < n_q
    q = tl.load(
        Q + z * n_q * D + i[:, None] * D + c[None, :], mask=row[:, None], other=0.0
    )
    do = tl.load(
        DO + z * n_q * DV + i[:, None] * DV + cv[None, :], mask=row[:, None], other=0.0
    )
    lse = tl.load(LSE + z * n_q + i, mask=row, other=0.0)
    delta = tl.load(DELTA + z * n_q + i, mask=row, other=0.0)
    dq = tl.zeros((BQ, D), tl.float32)
    end = n_k
    if CAUSAL:
        if BOUND:
            end = tl.minimum(n_k, pid_q * BQ + BQ)
    for j0 in range(0, end, BK):
        j = j0 + tl.arange(0, BK)
        k = tl.load(
            K + z * n_k * D + j[:, None] * D + c[None, :],
            mask=j[:, None] < n_k,
            other=0.0,
        )
        v = tl.load(
            V + z * n_k * DV + j[:, None] * DV + cv[None, :],
            mask=j[:, None] < n_k,
            other=0.0,
        )
        keep = j[None, :] < n_k
        if CAUSAL:
            keep = keep & (j[None, :] <= i[:, None])
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])
        dq += tl.dot(ds, k, input_precision="ieee") * sm_scale
    tl.store(DQ + z * n_q * D + i[:, None] * D + c[None, :], dq, mask=row[:, None])


def _independent_forward(hide_diagonal=False, mask_keys=True):
    def flash_attention_triton(q, k, v, causal=False):
        d, d_v = q.shape[-1], v.shape[-1]
        if d not in (16, 32, 64, 128) or d_v not in (16, 32, 64, 128):
            raise ValueError("widths must be a power of two >= 16")
        lead, n_q, n_k = q.shape[:-2], q.shape[-2], k.shape[-2]
        qf = q.reshape(-1, n_q, d).contiguous()
        kf = k.reshape(-1, n_k, d).contiguous()
        vf = v.reshape(-1, n_k, d_v).contiguous()
        o = torch.zeros(qf.shape[0], n_q, d_v)
        lse = torch.zeros(qf.shape[0], n_q)
        _indep_fwd[(-(-n_q // 32), qf.shape[0])](
            qf, kf, vf, o, lse, n_q, n_k, 1 / _math.sqrt(d), D=d, DV=d_v, BQ=32, BK=16,
            CAUSAL=causal, HIDE_DIAGONAL=hide_diagonal, MASK_KEYS=mask_keys,
        )  # fmt: skip
        return o.reshape(*lead, n_q, d_v), lse.reshape(*lead, n_q)

    return flash_attention_triton


_independent_flash = _independent_forward()


class _IndependentFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        o, lse = _independent_flash(q, k, v, causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, g):
        q, k, v, o, lse = ctx.saved_tensors
        d, d_v, n_q, n_k = q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]
        flat = [
            x.reshape(-1, x.shape[-2], x.shape[-1]).contiguous() for x in (q, k, v, g)
        ]
        delta = (g * o).sum(-1).reshape(-1, n_q).contiguous()
        lsef = lse.reshape(-1, n_q).contiguous()
        dq, dk, dv = (torch.zeros_like(x) for x in flat[:3])
        bh, scale = flat[0].shape[0], 1 / _math.sqrt(d)
        meta = dict(D=d, DV=d_v, BQ=32, BK=16, CAUSAL=ctx.causal)
        _indep_bwd_kv[(-(-n_k // 16), bh)](
            *flat, lsef, delta, dk, dv, n_q, n_k, scale, **meta
        )
        _indep_bwd_q[(-(-n_q // 32), bh)](
            *flat, lsef, delta, dq, n_q, n_k, scale, **meta
        )
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None


# The independent kernels without their causal loop bound: they load every key tile and
# mask it (a kernel may call another, which Triton inlines).
@triton.jit
def _indep_fwd_unbounded(
    Q, K, V, Out, LSE, n_q, n_k, sm_scale,
    D: tl.constexpr, DV: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    _indep_fwd(Q, K, V, Out, LSE, n_q, n_k, sm_scale, D, DV, BQ, BK, CAUSAL, False, True, False)  # fmt: skip


@triton.jit
def _indep_bwd_kv_unbounded(
    Q, K, V, DO, LSE, DELTA, DK, DV_, n_q, n_k, sm_scale,
    D: tl.constexpr, DV: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    _indep_bwd_kv(Q, K, V, DO, LSE, DELTA, DK, DV_, n_q, n_k, sm_scale, D, DV, BQ, BK, CAUSAL, False)  # fmt: skip


@triton.jit
def _indep_bwd_q_unbounded(
    Q, K, V, DO, LSE, DELTA, DQ, n_q, n_k, sm_scale,
    D: tl.constexpr, DV: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    _indep_bwd_q(Q, K, V, DO, LSE, DELTA, DQ, n_q, n_k, sm_scale, D, DV, BQ, BK, CAUSAL, False)  # fmt: skip


INDEPENDENT = {
    "flash_fwd_kernel": _indep_fwd,
    "flash_bwd_dkdv_kernel": _indep_bwd_kv,
    "flash_bwd_dq_kernel": _indep_bwd_q,
    "flash_attention_triton": _independent_flash,
    "FlashAttentionTriton": _IndependentFunction,
}


def test_an_implementation_from_the_chapters_text_earns_every_point():
    tests = load_chapter_tests("11_kernels")
    namespace = INDEPENDENT
    results = verdicts(tests, namespace)
    assert all(v.passed for v in results.values()), {
        k: v.message for k, v in results.items() if not v.passed
    }


@pytest.mark.parametrize(
    "slip",
    [
        dict(hide_diagonal=True),
        dict(mask_keys=False),
    ],  # j >= i hidden; padding scores 0
)
def test_wrong_kernels_outside_the_catalogue_fail(slip):
    tests = load_chapter_tests("11_kernels")
    selected = [t for t in tests.tests if t.exercise == "flash_attention_triton"]
    results = verdicts(
        tests, {"flash_attention_triton": _independent_forward(**slip)}, 0, selected
    )
    assert {k for k, v in results.items() if not v.passed} == {"k_wrapper"}


@pytest.mark.parametrize(
    "exercise, kernel, failing",
    [
        ("flash_fwd_kernel", _indep_fwd_unbounded, "k_fwd_kernel_causal"),
        ("flash_bwd_dkdv_kernel", _indep_bwd_kv_unbounded, "k_dkdv_kernel"),
        ("flash_bwd_dq_kernel", _indep_bwd_q_unbounded, "k_dq_kernel"),
    ],
)
def test_a_kernel_that_loads_tiles_no_query_sees_loses_the_causal_points(
    exercise, kernel, failing
):
    """The chapter teaches the causal loop bound: a kernel that loads every key tile and
    masks it computes the same numbers on clean inputs, but the tests fill the tiles no
    query of a tile can see with NaN. The same kernel with the bound keeps every point."""
    from autograder.known_mistakes.kernels import NO_BOUND

    tests = load_chapter_tests("11_kernels")
    selected = [t for t in tests.tests if t.exercise == exercise]
    unbounded = verdicts(tests, {exercise: kernel}, 0, selected)
    assert {k for k, v in unbounded.items() if not v.passed} == {failing}
    assert NO_BOUND[1] in unbounded[failing].message
    bounded = verdicts(tests, {exercise: INDEPENDENT[exercise]}, 0, selected)
    assert all(v.passed for v in bounded.values())


def _released_kernels() -> dict:
    """The kernels of the released student notebook, as a student receives them."""
    from tests.notebooks import release_notebook

    namespace = {"triton": triton, "tl": tl, "torch": torch}
    for cell in release_notebook("11_kernels").cells:
        if cell.cell_type == "code" and "@triton.jit\ndef flash_" in cell.source:
            exec(cell.source, namespace)
    return {name: namespace[name] for name in INDEPENDENT if name.endswith("_kernel")}


def test_a_notebook_without_triton_earns_no_kernel_point():
    """Wrappers written in plain PyTorch (the hidden tests' own yardstick) with the
    kernels left as stubs, or replaced by Python functions: the two wrapper points, none
    of the eight kernel points, and the feedback says why."""
    from autograder.grading.judging.judge import verdict
    from autograder.grading.judging.prepare import prepare
    from autograder.grading.sealed import probe
    from autograder.hidden_tests import kernels as hidden
    from tests.answers import code_of

    tests = load_chapter_tests("11_kernels")
    plain = {
        "flash_attention_triton": hidden.softmax_attention,
        "FlashAttentionTriton": hidden.SoftmaxAttentionFunction,
    }
    stubs = _released_kernels()
    assert len(stubs) == 3
    python = dict.fromkeys(stubs, hidden.launched_forward)
    for kernel_answers, why in (
        (stubs, "not implemented yet"),
        (python, "is not a Triton kernel"),
    ):
        namespace = {**kernel_answers, **plain}
        code = code_of(plain, tests.chapter)
        for p in prepare(tests, tests.tests, 0):
            got = probe.run_test(namespace, p.test_plan)  # as in the notebook's kernel
            v = verdict(tests, p, got, code)
            kernel_test = p.test.exercise.endswith("_kernel")
            assert v.passed != kernel_test, (p.test.id, v.message)
            if kernel_test:
                assert why in v.message, v.message


def test_without_triton_chapter_11_is_not_graded_and_the_grader_says_why(tmp_path):
    """macOS and Windows have no Triton: there the grader grades nothing of chapter 11
    (``graded: False``, never a zero) and says why, with --assignment and without."""
    import json

    from tests.notebooks import release_notebook, write

    notebook = write(release_notebook("11_kernels"), tmp_path / "11_kernels.ipynb")
    results = []
    for extra in (["--assignment", "11_kernels"], []):
        code = (
            "import sys\n"
            "sys.modules['triton'] = None  # as on a machine without Triton\n"
            "from autograder.__main__ import main\n"
            f"sys.exit(main(['grade', {str(notebook)!r}, '--json', *{extra!r}]))\n"
        )
        run = run_python(code)
        assert run.returncode == 4, run.stderr[-2000:]  # 4: something was not graded
        results.append(json.loads(run.stdout.splitlines()[-1]))
    for result in results:
        assert result["graded"] is False and result["score"] == 0.0
        assert "Triton is built for Linux only" in result["message"]


def _mantissa_rounded(bits: int):
    """The reference forward with its output rounded to ``bits`` mantissa bits: a kernel
    some tens of times less accurate than PyTorch's float32 attention."""
    from autograder.grading.judging.spec import load_chapter_tests

    reference = load_chapter_tests("11_kernels").reference()
    drop = (1 << (23 - bits)) - 1

    def flash_attention_triton(q, k, v, causal=False):
        out, lse = reference.flash_attention_triton(q, k, v, causal)
        rounded = (out.view(torch.int32) + (drop + 1) // 2) & ~drop
        return rounded.view(torch.float32), lse

    return flash_attention_triton


def test_the_hidden_tests_hold_kernels_to_flashattentions_rule_not_a_fixed_tolerance():
    """An output rounded to 16 mantissa bits is within the "module" tolerance of the
    reference, and about 30 times PyTorch's float32 error from the truth: it fails."""
    from autograder.grading.judging.prepare import prepare
    from autograder.grading.judging.spec import load_chapter_tests
    from autograder.grading.judging.tolerances import LEVELS

    tests = load_chapter_tests("11_kernels")
    selected = [tests.test("k_wrapper")]
    rounded = _mantissa_rounded(16)
    results = verdicts(tests, {"flash_attention_triton": rounded}, 0, selected)
    assert not results["k_wrapper"].passed
    assert "FlashAttention's rule" in results["k_wrapper"].message
    (prepared,) = prepare(tests, selected, 0)
    q, k, v = prepared.cases[0].args
    out, _ = rounded(q, k, v)
    tol = LEVELS["module"]
    assert torch.allclose(out, prepared.expected[0]["value"][0], tol.rtol, tol.atol)


def test_the_chapter_states_the_budgets_the_grader_applies():
    from autograder.grading.judging.tolerances import FLASH_RULE, FLASH_RULE_GRADIENTS

    page = (paths.REPO / "chapters/11_kernels/11_kernels.md").read_text()
    stated = f"FORWARD_FACTOR, GRADIENT_FACTOR = {FLASH_RULE.factor:g}, "
    assert stated + f"{FLASH_RULE_GRADIENTS.factor:g}  #" in page
    assert FLASH_RULE.floor == FLASH_RULE_GRADIENTS.floor == 1e-6  # "plus 1e-6"


def test_the_grader_runs_triton_in_its_interpreter_on_any_machine():
    """Hidden tests pass CPU tensors: on a machine with a GPU too, the grader's reference
    and the student's kernel run in the interpreter."""
    from autograder.grading.running import execute
    from autograder.grading.running.sandbox import zygote

    assert execute._kernel_environment()["TRITON_INTERPRET"] == "1"
    assert (
        zygote.kernel_environment({"path": [], "threads": 1})["TRITON_INTERPRET"] == "1"
    )
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '0'\n"
        "from autograder.grading.judging.spec import load_chapter_tests\n"
        "load_chapter_tests('11_kernels').reference()\n"
        "print(os.environ['TRITON_INTERPRET'])\n"
    )
    run = run_python(code)
    assert run.stdout.strip() == "1", run.stderr[-2000:]


def test_a_stub_kernel_is_described_as_not_implemented():
    """Triton's interpreter wraps what a kernel raises (``InterpreterError``): the
    feedback still says the stub was not written, not that the interpreter failed."""
    from autograder.grading.sealed import probe

    @triton.jit
    def stub_kernel(x_ptr, BLOCK: tl.constexpr):
        raise NotImplementedError

    with pytest.raises(Exception) as raised:
        stub_kernel[(1,)](torch.zeros(4), BLOCK=4)
    assert type(raised.value).__name__ == "InterpreterError"
    assert probe.NOT_IMPLEMENTED in probe._describe(raised.value)


def test_the_graders_threads_run_the_reference_kernels_one_at_a_time():
    """Triton's interpreter patches ``triton.language`` for the whole process while a
    kernel runs: two of the grader's threads answering stand-ins at once (a class graded
    with --jobs 2) undid each other's patches, and about a quarter of the calls failed
    ("Did you forget to add @triton.jit?"). The reference runs under one lock."""
    import threading

    from autograder.grading.judging.upstream import ReferenceServer

    server = ReferenceServer(vars(load_chapter_tests("11_kernels").reference()))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 16, generator=g) for n in (37, 45, 45))
    request = {"name": "flash_attention_triton", "kind": "call", "args": [q, k, v]}
    errors = []

    def answer_many():
        for _ in range(15):
            try:
                server(request)
            except Exception as exc:  # noqa: BLE001 (counted, then reported)
                errors.append(repr(exc)[:200])

    threads = [threading.Thread(target=answer_many) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]


def test_a_kernel_wrappers_answer_is_sized_before_it_is_computed():
    """The meta device cannot run a Triton kernel; while an answer is sized there, the
    course's launches do nothing (the wrapper made its output already), so a stand-in
    for a wrapper is sized as any other: within the test's bound it is computed, past it
    refused."""
    from autograder.grading.judging.upstream import ReferenceServer, TooLarge

    server = ReferenceServer(vars(load_chapter_tests("11_kernels").reference()))
    q = torch.randn(1, 37, 16, generator=torch.Generator().manual_seed(0))
    request = {"name": "flash_attention_triton", "kind": "call", "args": [q, q, q]}
    out = server(request, [37, q.numel()])
    out = out[0] if isinstance(out, list) else out  # (output, log-sum-exp)
    torch.testing.assert_close(
        out, torch.softmax(q @ q.mT / 4, -1) @ q, rtol=1e-4, atol=1e-5
    )
    with pytest.raises(TooLarge, match="more than the grader computes"):
        server(request, [37, 16])  # an answer of 592 numbers, over 16 x 16

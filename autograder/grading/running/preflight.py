"""Prove the jail before grading anything: a canary kernel must start, run a cell, hide
the course, and have one hidden test judged right on an answer known to be right.

If it cannot, nothing is graded: ``SandboxUnavailable`` carries one message naming the
cause and the fix (``sandbox/diagnose.py``). ``python -m autograder check`` runs this and
more, so an instructor can test a machine before the deadline.
"""

from __future__ import annotations

import importlib.util

import nbformat

from autograder.grading.judging.judge import verdict
from autograder.grading.judging.prepare import prepare
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.running.execute import run_notebook
from autograder.grading.running.limits import Limits
from autograder.grading.running.sandbox import SandboxUnavailable
from autograder.grading.running.sandbox.diagnose import explain
from autograder.grading.running.student_code import StudentCode
from autograder.paths import REPO

# one test per phase of the sealed window: the second runs with PyTorch's attention
# switched off, so the canary proves the attention guard too
CHAPTER, TESTS = "03_self_attention", ("causal_mask_values", "sdpa_basic")

# A right answer written for the canary (not the reference), and the jail's promises.
CANARY = f"""
import os
import torch

for hidden in {[str(REPO / "solutions"), str(REPO / "autograder")]!r}:
    assert not os.path.exists(hidden), "the course repository is visible in the jail"
assert os.getcwd() == "/submission", "the kernel is not in its private folder"
open("canary.txt", "w").write("written")


def causal_mask(n):
    return torch.ones(n, n).tril().bool()


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
"""


# Chapter 11's kernels run in Triton's interpreter in the jail: a kernel there must call
# Triton's own library functions (``tl.sum`` and friends are ``@triton.jit`` functions,
# made when Triton is imported, so compiled-mode ones if it was imported with the
# interpreter off). Proven where Triton is installed; where it is not, chapter 11 is not
# graded at all (``grade.missing_requirement``).
TRITON_CANARY = """
import triton
import triton.language as tl


@triton.jit
def canary_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tile = tl.zeros((BLOCK,), tl.float32) + x
    tl.store(out_ptr, tl.sum(tile, 0))
    tl.store(out_ptr + 1, tl.max(tile, 0))
    tl.store(out_ptr + 2, tl.cdiv(n, 2) + 0.0)


x, out = torch.arange(1.0, 6.0), torch.zeros(3)
canary_kernel[(1,)](x, out, 5, BLOCK=8)
assert out.tolist() == [15.0, 5.0, 3.0], f"the kernel computed {out.tolist()}"
"""
TRITON_FAULT = (
    "Triton's interpreter does not run kernels in the jail ({error}). Nothing was graded "
    "and no grade was recorded: chapter 11's answers would be judged wrong through no "
    "fault of theirs. Please report it with this message."
)


def _with_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def prove(sandbox, limits: Limits | None = None) -> None:
    """Raise ``SandboxUnavailable`` unless a canary submission is graded right (and,
    where Triton is installed, a Triton kernel runs in its interpreter in the jail)."""
    limits = limits or sandbox.limits
    tests = load_chapter_tests(CHAPTER)
    prepared = prepare(tests, [tests.test(t) for t in TESTS], seed=0)
    sources = [CANARY, TRITON_CANARY] if _with_triton() else [CANARY]
    nb = nbformat.v4.new_notebook(cells=list(map(nbformat.v4.new_code_cell, sources)))
    # the Triton canary is the last code cell, where there is one
    triton_cell = f"code cell {len(sources)}:" if TRITON_CANARY in sources else None
    with sandbox.kernel() as (km, workdir):
        got, run = run_notebook(nb, prepared, km, workdir, limits)
        end = sandbox.end(km, workdir)
    found = [
        verdict(tests, p, g, StudentCode([CANARY]))
        for p, g in zip(prepared, got, strict=True)
    ]
    problem = None
    if run.start_failed:
        problem = (
            f"the canary kernel did not start: {end.log_tail() or run.start_failed}"
        )
    elif run.died_in_cell is not None or run.died_in_test:
        problem = f"the canary kernel died (signal {end.signal}, exit {end.exit_code})"
    elif run.grader_fault:
        problem = f"the canary's tests could not run: {run.grader_fault}"
    elif triton_cell and run.errors and run.errors[0].startswith(triton_cell):
        raise SandboxUnavailable(TRITON_FAULT.format(error=run.errors[0]))
    elif run.errors:
        problem = f"the canary cell failed: {run.errors[0]}"
    elif not all(f.passed for f in found):
        wrong = next(f for f in found if not f.passed)
        problem = f"a right answer was judged wrong: {wrong.message}"
    if problem:
        raise SandboxUnavailable(explain(problem))

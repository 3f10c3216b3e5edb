"""``python -m autograder check``: is this machine ready to grade? Run it before a deadline.

It prints the course version and each assignment's digest (``provenance.py``), starts the jail, proves it on the canary (``preflight.py``), shows from inside a
kernel who it runs as and under which limits, then grades chapter 3's filled-in notebook
(full marks expected) and its untouched student notebook (zero expected). Exit 0 when
all holds, 3 when the jail cannot start or a grade comes out wrong.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.grading.judging.spec import graded_chapters
from autograder.grading.recording.provenance import assignment_digest
from autograder.grading.running.execute import run_notebook
from autograder.grading.running.limits import Limits
from autograder.paths import course_version, nbgrader_source, release_notebook

CHAPTER = "03_self_attention"

# run in a jailed kernel; it writes what it sees into its kernel folder for the grader
INSIDE = """
import os, resource
report = (
    f"uid {{os.getuid()}}, at most {{resource.getrlimit(resource.RLIMIT_NPROC)[0]}} "
    f"processes, {{resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20}} MB of address "
    f"space, root folder {{sorted(os.listdir('/'))}}"
)
open({path!r}, "w").write(report)
"""


def _inside(sandbox, limits: Limits) -> str:
    """What a jailed kernel reports about itself."""
    with sandbox.kernel() as (km, workdir):
        report = workdir / "inside.txt"
        cell = nbformat.v4.new_code_cell(INSIDE.format(path=str(report)))
        _, run = run_notebook(
            nbformat.v4.new_notebook(cells=[cell]), [], km, workdir, limits
        )
        sandbox.end(km, workdir)
        try:
            return report.read_text()
        except OSError:
            return f"no report ({'; '.join(run.errors) or 'nothing written'})"


def check(limits: Limits) -> int:
    from autograder.grading.grade import grade_notebook
    from autograder.grading.running.preflight import prove
    from autograder.grading.running.sandbox import Sandbox, SandboxUnavailable

    def say(line: str) -> None:
        print(line, flush=True)

    say(f"grader: uid {os.getuid()}, Python {sys.executable}")
    say(f"course version {course_version()}; digests of what grades each assignment:")
    for chapter in graded_chapters():
        say(f"     {chapter}: {assignment_digest(chapter)}")
    started = time.monotonic()
    try:
        sandbox = Sandbox(limits)
    except SandboxUnavailable as exc:
        say(f"FAIL {exc}")
        return 3
    with sandbox:
        try:
            prove(sandbox, limits)
        except SandboxUnavailable as exc:
            say(f"FAIL {exc}")
            return 3
        say(
            f"ok   jail started and canary graded right in {time.monotonic() - started:.1f} s"
        )
        if sandbox.kernel_ids:
            first, count = sandbox.kernel_ids
            say(f"ok   run as root: kernels run as uids {first}..{first + count - 1}")
        say(
            f"ok   limits per submission: {limits.memory_mb} MB for all it holds "
            f"together (processes, tmpfs files, shared memory; summed every "
            f"{limits.watch_period:g} s), {limits.kernel_dir_mb} MB in its kernel "
            f"directory, {limits.processes} "
            f"processes and threads, {limits.cell:g} s per cell, {limits.notebook:g} s in all"
        )
        say(f"     inside a kernel: {_inside(sandbox, limits)}")
        failures = 0
        with tempfile.TemporaryDirectory(prefix="course-check-") as tmp:
            for name, source, full in (
                ("filled-in", nbgrader_source(CHAPTER), True),
                ("untouched", release_notebook(CHAPTER), False),
            ):
                path = Path(tmp) / f"{name}.ipynb"
                path.write_bytes(source.read_bytes())
                r = grade_notebook(path, CHAPTER, limits=limits, sandbox=sandbox)
                right = r["graded"] and r["score"] == (r["max_score"] if full else 0)
                failures += not right
                say(
                    f"{'ok  ' if right else 'FAIL'} {name} chapter-3 notebook: "
                    f"{r['score']:g} / {r['max_score']:g} {r['message']}".rstrip()
                )
    say("ready to grade" if not failures else "NOT ready: a grade came out wrong")
    return 0 if not failures else 3

"""Grade student notebooks: run them, call their exercises on fresh inputs, judge the outputs.

For each notebook: read it (a broken file is a result, not a crash), recognise its chapter,
draw the hidden tests' inputs, execute the student's code cells in a fresh kernel with time
limits, then run one probe cell per hidden test that calls the student's functions and saves
their raw outputs. The verdicts are made here, in the grader's process, by
``judge.verdict`` from those outputs, the reference's and the student's code read as text.
Test cells in the submission are never trusted: editing or deleting them changes nothing.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import nbformat
from nbgrader.preprocessors import DeduplicateIds

from autograder.grading.judging import delegation
from autograder.grading.judging.judge import (
    NO_RESULT_MARK,
    Verdict,
    attribute,
    passes_alone,
    verdict,
)
from autograder.grading.judging.prepare import PreparedTest, prepare
from autograder.grading.judging.reading import read as read_code
from autograder.grading.judging.spec import (
    ChapterTests,
    graded_chapters,
    load_chapter_tests,
)
from autograder.grading.recording.provenance import stamp
from autograder.grading.running.execute import Run, run_notebook
from autograder.grading.running.limits import Limits
from autograder.grading.running.sandbox import KernelEnd, Sandbox, Unsandboxed
from autograder.grading.running.student_code import (
    StudentCode,
    course_cells,
    demo_sources,
    given_sources,
    is_course_cell,
)


@functools.lru_cache(maxsize=4096)
def _top_level_definitions(source: str) -> frozenset[str]:
    """The functions and classes a cell defines at its top level. Cached: the course's
    own cells are the same in every notebook of a class."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return frozenset()
    return frozenset(
        n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)
    )


def _defined_names(nb) -> set[str]:
    names = set()
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            names |= _top_level_definitions(cell.source)
    return names


def _fingerprint(nb) -> tuple[set, set[str]]:
    """The notebook's grade ids and top-level definitions; fails on cells that are not
    cells (the submission's fault)."""
    grade_ids = {
        c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells
    }
    return grade_ids, _defined_names(nb)


def missing_requirement(chapter: str) -> str | None:
    """Why ``chapter`` cannot be graded on this machine, or None: its tests, reference or
    known mistakes import a package that is not installed here (chapter 11 needs Triton,
    which has no build for macOS or Windows). Such a chapter is never graded here, so never
    given a zero."""
    try:
        load_chapter_tests(chapter).reference()
    except ImportError as exc:
        package = exc.name or str(exc)
        return (
            f"{chapter} needs {package}, which is not installed on this machine "
            f"({sys.platform}; Triton is built for Linux only): grade it on Linux"
        )
    return None


def detect_chapter(grade_ids: set, names: set[str]) -> str | None:
    """The chapter whose graded cells and exercise names a notebook shares most."""
    best, best_score = None, 0
    for chapter in graded_chapters():
        try:
            tests = load_chapter_tests(chapter)
        except Exception:  # noqa: BLE001 (one broken chapter must not stop recognising others)
            continue
        score = 10 * len(grade_ids & {t.id for t in tests.tests}) + len(
            names & set(tests.exercises)
        )
        if score > best_score:
            best, best_score = chapter, score
    return best


class GraderFault(Exception):
    """The kernel failed for a reason outside the submission: it never started, or
    something outside the jail (the host's out-of-memory killer, an administrator)
    killed it. Such a run is no grade: retried once, then reported ungraded."""


class Batch:
    """What the notebooks of one batch share: the sandbox, the seed, the hidden tests'
    inputs and the reference's outputs for that seed (drawn once, not once per
    notebook), and a count of kernels that failed to start. When most fail so, the
    batch stops rather than record a wall of zeros."""

    def __init__(self, sandbox, seed: int, limits: Limits):
        self.sandbox, self.seed, self.limits = sandbox, seed, limits
        self._lock = threading.Lock()
        self.started = self.failed = 0
        self.cause = ""
        self._prepared: dict[tuple[str, int], list[PreparedTest]] = {}
        self._preparing = threading.Lock()

    def prepared(self, tests: ChapterTests, seed: int) -> list[PreparedTest]:
        """Every hidden test of ``tests`` prepared for ``seed``: computed once per batch,
        a private copy for each notebook (the judge may not alter what another reads)."""
        with self._preparing:
            key = (tests.chapter, seed)
            if key not in self._prepared:
                self._prepared[key] = prepare(tests, tests.tests, seed)
            return copy.deepcopy(self._prepared[key])

    def record_start(self, failure: str | None) -> None:
        with self._lock:
            if failure is None:
                self.started += 1
            else:
                self.failed += 1
                self.cause = self.cause or failure

    @property
    def stopped(self) -> bool:
        return self.failed >= 3 and self.failed > self.started


STOPPED = "the batch was stopped"


def _missing_reason(run: Run, end: KernelEnd) -> str:
    why = "os._exit, a crash, or running out of memory"
    if end.killed_by == "memory":
        why = "your code's processes together held more memory than the limit"
    if run.died_in_cell is not None:
        return (
            f"{NO_RESULT_MARK} the kernel died while running code cell {run.died_in_cell} of "
            f"your notebook ({why}), so nothing after it ran"
        )
    if run.died_in_test:
        return f"{NO_RESULT_MARK} the kernel died while the hidden tests called your code ({why})"
    return (
        f"{NO_RESULT_MARK} the test did not finish within its time limit, or your code "
        "stopped it"
    )


def grade_notebook(
    path: Path | str,
    assignment: str | None = None,
    seed: int | None = None,
    limits: Limits | None = None,
    sandbox: Sandbox | Unsandboxed | None = None,
    retry: bool = True,
    batch: Batch | None = None,
) -> dict:
    """Grade one notebook; never raises for anything the submission does. Without a
    ``sandbox``, starts one for this notebook alone (``grade_many`` shares one). A run
    spoiled by a grader fault is tried again once (``retry``); a result the grader
    could not trust has ``graded: False`` and a message saying why."""
    if sandbox is None:
        with Sandbox(limits or Limits(), hide=[Path(path).resolve().parent]) as own:
            return grade_notebook(path, assignment, seed, limits, own, retry)
    started = time.perf_counter()
    result = _grade_notebook(path, assignment, seed, limits, sandbox, retry, batch)
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def _grade_notebook(path, assignment, seed, limits, sandbox, retry, batch) -> dict:
    limits = limits or sandbox.limits
    seed = secrets.randbits(32) if seed is None else seed
    batch = batch or Batch(sandbox, seed, limits)
    result = {
        "notebook": str(path),
        "assignment": None,
        "score": 0.0,
        "max_score": 0.0,
        "tests": [],
        "flags": [],  # for the instructor's review; never a point (delegation.flags)
        "seed": seed,
        "graded": True,
        "message": "",
    }
    stamp(result, None)  # the course version; the digest once the assignment is known
    if assignment and (missing := missing_requirement(assignment)):
        result["assignment"] = assignment
        return _not_graded(result, missing)
    tests = _set_assignment(result, assignment) if assignment else None
    try:
        nb = nbformat.read(path, as_version=4)
        if (too_large := _too_much_code(nb, tests, limits)) is not None:
            return _not_graded(result, too_large)
        with delegation.READING_CODE:
            fingerprint = _fingerprint(nb)
    except (
        SystemError,
        RecursionError,
        MemoryError,
    ) as exc:  # not the file: the grader
        return _not_graded(
            result, f"the grader failed reading the notebook ({exc!r:.200})"
        )
    except Exception as exc:  # noqa: BLE001 (any unreadable file gets a grade and a message)
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        return _ungraded(
            result,
            f"could not read the notebook ({why})",
            "the notebook could not be read",
        )
    try:
        detected = detect_chapter(*fingerprint)
    except Exception as exc:  # noqa: BLE001 (the grader's fault, never the submission's)
        return _not_graded(
            result, f"the grader could not load the chapters' tests ({exc!r:.200})"
        )
    if tests is None:
        if detected is None:
            missing = [m for c in graded_chapters() if (m := missing_requirement(c))]
            return _not_graded(
                result,
                "could not recognise the chapter of this notebook; pass --assignment"
                + "".join(f" (not recognised here: {m})" for m in missing),
            )
        tests = _set_assignment(result, detected)
    notes = []
    if detected is not None and detected != tests.chapter:
        notes.append(
            f"this notebook looks like chapter {detected}, not {tests.chapter}"
        )
    for attempt in range(2 if retry else 1):
        if batch.stopped:
            return _not_graded(
                result,
                f"{STOPPED}: {batch.failed} of {batch.failed + batch.started} kernels "
                f"failed to start ({batch.cause})",
            )
        try:
            verdicts, run, end = _grade(nb, tests, seed, limits, sandbox, batch)
            break
        except GraderFault as fault:
            if attempt == 1 or not retry:
                return _not_graded(result, f"grader fault: {fault}", fault=str(fault))
            notes.append(f"graded on a second try: the first was spoiled ({fault})")
        except Exception as exc:  # noqa: BLE001 (a grader bug must not stop the batch)
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
            return _not_graded(
                result,
                f"the grader failed on this notebook ({why}); please report this to the "
                "course staff",
            )
    result["tests"] = [v.as_json() for v in verdicts]
    result["score"] = float(sum(v.score for v in verdicts))
    result["flags"] = run.flags
    result["phases"] = _phases(run.marks)  # where its time went (the benchmark's sums)
    result["peak_mb"] = end.peak_mb  # the most its processes held together, if watched
    if run.died_in_cell is not None or run.died_in_test:
        notes.append(_missing_reason(run, end))
    if end.killed_for_memory_mb:
        held = ", ".join(f"{mb:g} MB" for mb in end.killed_for_memory_mb)
        notes.append(
            f"your code's processes together held more than {limits.memory_mb} MB: the "
            f"grader killed the largest ({held})"
        )
    if run.errors:
        notes.append(
            f"{len(run.errors)} problem(s) while running, first: {run.errors[0]}"
        )
    result["message"] = "; ".join(notes)
    return result


def _too_much_code(nb, tests: ChapterTests | None, limits: Limits) -> str | None:
    """Why the notebook's own code is more than the grader reads, or None: bounded before
    a line of it is parsed. Cells that are a course cell's unchanged source do not count."""
    given = set()
    for chapter in [tests.chapter] if tests else graded_chapters():
        given.update(given_sources(chapter))
    own = sum(
        len(c.get("source", ""))
        for c in nb.cells
        if c.get("cell_type") == "code"
        and isinstance(c.get("source"), str)
        and c.get("source") not in given
    )
    if own <= limits.code_kb * 1024:
        return None
    return (
        f"the notebook's own code is {own / 1024:,.0f} KB, more than the "
        f"{limits.code_kb} KB the grader reads; keep data out of code cells (load it "
        "from a file) and delete large scratch cells, then submit again"
    )


def _set_assignment(result: dict, chapter: str) -> ChapterTests:
    """The assignment fixes the tests and ``max_score``, whatever the submission holds,
    and the digest of what grades it (``provenance.assignment_digest``)."""
    tests = load_chapter_tests(chapter)
    result["assignment"] = chapter
    stamp(result, chapter)
    result["max_score"] = tests.max_score
    result["tests"] = [
        Verdict(t.id, t.points, False, "not graded").as_json() for t in tests.tests
    ]
    return tests


def _ungraded(result: dict, message: str, why: str) -> dict:
    """The submission's own fault (an unreadable file): a grade of zero, and why."""
    result["message"] = f"{message}; nothing was graded"
    for t in result["tests"]:
        t["message"] = f"not graded: {why}"
    return result


def _not_graded(result: dict, why: str, fault: str | None = None) -> dict:
    """Not the submission's fault: no grade at all (``graded: False``), and why. A
    ``fault`` that a later try may not meet is kept for ``grade_many``'s second round."""
    result["graded"] = False
    result["score"] = 0.0
    result["message"] = (
        f"not graded: {why}. This is no grade: grade this notebook again"
    )
    for t in result["tests"]:
        t.update(score=0.0, passed=False, message=f"not graded: {why}")
    if fault is not None:
        result["fault"] = fault
    return result


def restored(nb, chapter: str):
    """``nb`` with the course's read-only cells as the course wrote them, as ``nbgrader
    autograde`` runs it (``DeduplicateIds``, then ``OverwriteCells`` by grade id): a
    student's edit there is undone; of two cells with one grade id, the last keeps it;
    a read-only cell whose grade id the course has not is the student's own. Beyond
    nbgrader, a read-only cell the student deleted is put back after the course cell it
    followed, so the course's code runs in its order whatever the submission holds."""
    nb = copy.deepcopy(nb)
    DeduplicateIds().preprocess(nb, {})
    course = course_cells(chapter)
    known = {c.metadata.nbgrader.grade_id: c for c in course}
    for i, cell in enumerate(nb.cells):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in known and is_course_cell(known[grade_id]):
            nb.cells[i] = copy.deepcopy(known[grade_id])
        elif grade_id not in known and is_course_cell(cell):
            del cell.metadata["nbgrader"]
    at = 0
    for cell in course:
        grade_id = cell.metadata.nbgrader.grade_id
        found = [i for i, c in enumerate(nb.cells) if _grade_id(c) == grade_id]
        if found:
            at = found[0] + 1
        elif is_course_cell(cell):
            nb.cells.insert(at, cell)
            at += 1
    return nb


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _grade(
    nb, tests: ChapterTests, seed: int, limits: Limits, sandbox, batch: Batch
) -> tuple[list[Verdict], Run, KernelEnd]:
    nb = restored(nb, tests.chapter)
    prepared = batch.prepared(tests, seed)
    started = time.perf_counter()
    with sandbox.kernel() as (km, workdir):
        got, run = run_notebook(
            nb,
            prepared,
            km,
            workdir,
            limits,
            demo_sources(tests.chapter),
            lambda i, outcomes: passes_alone(tests, prepared[i], outcomes),
        )
        end = sandbox.end(km, workdir)
    run.marks.update(started=started, ended=time.perf_counter())
    batch.record_start(run.start_failed)
    if run.start_failed:
        raise GraderFault(
            f"the kernel did not start: {end.log_tail() or run.start_failed}"
        )
    if run.grader_fault:
        raise GraderFault(run.grader_fault)
    died = run.died_in_cell is not None or run.died_in_test
    if died and end.killed_from_outside:
        how = "its sandbox process was lost" if end.lost else f"signal {end.signal}"
        raise GraderFault(
            f"the kernel was killed from outside the submission ({how}; the host's "
            "out-of-memory killer or an administrator)"
        )
    reason = _missing_reason(run, end)
    code = StudentCode.of_notebook(nb, tests.chapter)
    exercises = [(p.test.exercise, p.test.forbidden) for p in prepared]
    reading = read_code(code, exercises, tests.chapter)  # in a process of its own
    run.flags = reading.flags
    code = dataclasses.replace(code, remarks=reading.remarks)
    verdicts = [
        verdict(tests, p, g, code, reason, run.second_runs.get(i))
        for i, (p, g) in enumerate(zip(prepared, got, strict=True))
    ]
    attribute(verdicts, prepared)
    for found in verdicts:
        _name_the_slow_cell(found, run.timed_out_cells, limits)
    return verdicts, run, end


# What a failed test says when the student's code it calls was never defined or run
_NOT_RUN = ("does not define", "NameError", NO_RESULT_MARK)


def _name_the_slow_cell(found, timed_out: list[int], limits: Limits) -> None:
    """A test that failed because the student's code was missing names the cell that a
    time limit interrupted: that cell, not the exercise, is what to fix first."""
    if found.passed or not timed_out or not any(s in found.message for s in _NOT_RUN):
        return
    cells = ", ".join(str(n) for n in timed_out)
    found.message = (
        f"{found.message} Code cell {cells} of your notebook ran past its time limit "
        f"({limits.cell:g} s a cell, {limits.notebook:g} s for all your cells) and was "
        "interrupted, so what it would have defined or run after that point is missing: "
        "make it faster, or move slow work out of the graded notebook."
    )
    found.__post_init__()


def _phases(marks: dict[str, float]) -> dict[str, float]:
    """Seconds of one notebook's run (``Run.marks``): the kernel's start (until its
    first cell), the student's cells, the hidden tests (the probe), the kernel's end."""
    end = marks.get("end", marks["ended"])
    tests = marks.get("tests", end)
    cells = marks.get("cells", tests)
    return {
        "kernel start": round(cells - marks["started"], 3),
        "student cells": round(tests - cells, 3),
        "tests": round(end - tests, 3),
        "kernel end": round(marks["ended"] - end, 3),
    }


def _in_a_thread(function, *args):
    """``function(*args)`` in a thread of its own, as every notebook is graded. In the
    main thread nbclient takes SIGINT and SIGTERM over while the kernel starts and then
    puts Python's defaults back: a Ctrl-C there would kill the canary (read as a jail
    that cannot start), and the class run's handlers (``autograde.stop_on_signals``)
    would be lost."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(function, *args).result()


def _finish_started(futures, reported, on_result) -> None:
    """After a stop: cancel the notebooks not started, wait for those being graded and
    report each one graded (not one a grader fault spoiled)."""
    for future in futures:
        future.cancel()
    running = sum(not (f.cancelled() or f.done()) for f in futures)
    if running:
        print(
            f"[autograder] stopping: {running} notebook(s) being graded finish first "
            "(within their time limit); a second Ctrl-C stops at once",
            file=sys.stderr,
            flush=True,
        )
    for future in futures:
        if future.cancelled() or future in reported:
            continue
        try:
            result = future.result()
        except Exception:  # noqa: BLE001 (no result: graded again on the next run)
            continue
        if on_result is not None and "fault" not in result:
            on_result(result)


def grade_many(
    paths: list[Path],
    assignment: str | None = None,
    jobs: int = 1,
    seed: int | None = None,
    limits: Limits | None = None,
    sandboxed: bool = True,
    on_result: Callable[[dict], None] | None = None,
    timings: dict | None = None,
    on_start: Callable[[Path], None] | None = None,
    sandbox: Sandbox | None = None,
) -> Iterator[dict]:
    """Grade notebooks ``jobs`` at a time, each in a fresh kernel forked from one warm
    sandbox, after proving the sandbox on a canary; yields results in the order of
    ``paths``. A notebook whose run a grader fault spoiled is graded again once, alone,
    after the others. ``on_result`` is called with each result as it is made (a
    progress bar), ``on_start`` with each path as a worker takes it up. ``timings`` (if
    given) gets ``start``: the seconds before the first notebooks start (the references
    loaded, the sandbox started and proven). A ``sandbox`` (if given) is one the caller
    started for ``paths`` (``Sandbox.for_notebooks``) before it imported this module;
    it is closed here. Raises ``SandboxUnavailable`` (nothing graded) when the canary
    fails."""
    from autograder.grading.running.preflight import prove

    started = time.perf_counter() if sandbox is None else sandbox.created
    seed = secrets.randbits(32) if seed is None else seed
    limits = limits or Limits()
    if sandbox is None:
        sandbox = (
            Sandbox.for_notebooks(paths, limits) if sandboxed else Unsandboxed(limits)
        )
    with sandbox:
        # Import every chapter's tests and reference here, once, before the workers
        # start: imported first by two threads at once, a module can be seen
        # half-initialised. A chapter this machine cannot load (no Triton) is not
        # graded: grade_notebook says so.
        for chapter in graded_chapters():
            if missing_requirement(chapter) is None:
                load_chapter_tests(chapter).reference()
        sandbox.ready()
        if sandboxed:  # unjailed, the canary's promises (the course hidden) cannot hold
            _in_a_thread(prove, sandbox, limits)
        batch = Batch(sandbox, seed, limits)
        if timings is not None:
            timings["start"] = time.perf_counter() - started

        def graded(path):
            if on_start is not None:
                on_start(path)
            return grade_notebook(path, assignment, seed, limits, sandbox, False, batch)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {pool.submit(graded, p): i for i, p in enumerate(paths)}
            results = [None] * len(paths)
            reported = set()
            try:
                for future in as_completed(futures):
                    results[futures[future]] = result = future.result()
                    if on_result is not None and "fault" not in result:
                        on_result(result)
                    reported.add(future)
            except BaseException:
                # stopped (Ctrl-C, SIGTERM): the notebooks not started are not graded;
                # those being graded finish (their kernels run in a session of their
                # own, untouched by the signal) and are reported, so nothing finished
                # is lost
                _finish_started(futures, reported, on_result)
                raise
        for i, first in enumerate(results):
            if "fault" not in first:
                continue
            if not batch.stopped:
                again = grade_notebook(
                    paths[i], assignment, seed, limits, sandbox, False, batch
                )
                note = f"graded on a second try, alone: the first was spoiled ({first['fault']})"
                again["message"] = "; ".join(m for m in (note, again["message"]) if m)
                results[i] = again
            if on_result is not None:
                on_result(results[i])
        yield from results

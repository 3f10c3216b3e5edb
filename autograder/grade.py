"""Grade student notebooks: run them, call their exercises on fresh inputs, judge the outputs.

For each notebook: read it (a broken file is a result, not a crash), recognise its chapter,
draw the hidden tests' inputs, execute the student's code cells in a fresh kernel with time
limits, then run one probe cell per hidden test that calls the student's functions and saves
their raw outputs. The verdicts are computed here, in the grader's process, by comparing
those outputs with the reference's (``judge.py``). Test cells in the submission are never
trusted: editing or deleting them changes nothing.
"""

from __future__ import annotations

import ast
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from autograder import delegation, probe
from autograder.judge import Verdict, judge
from autograder.limits import Limits
from autograder.paths import release_notebook
from autograder.prepare import PreparedTest, prepare
from autograder.sandbox import Sandbox, Unsandboxed, kill_kernel
from autograder.spec import ChapterTests, graded_chapters, load_chapter_tests


class _QuietClient(NotebookClient):
    """Keeps only error names and messages, so a cell that prints gigabytes costs nothing;
    a cell that prints more than ``output_limit`` bytes is interrupted."""

    output_limit: int = 10 * 2**20
    printed: int = 0
    flooded_cell: int | None = None

    def output(self, outs, msg, display_id, cell_index):
        content = msg["content"]
        self.printed += len(str(content.get("text", ""))) + sum(
            len(str(v)) for v in content.get("data", {}).values()
        )
        if self.printed > self.output_limit and self.flooded_cell is None:
            self.flooded_cell = cell_index
            self._interrupt()
        if msg["msg_type"] == "error":
            content = msg["content"]
            outs[:] = [
                {
                    "ename": str(content.get("ename", ""))[:100],
                    "evalue": str(content.get("evalue", ""))[:300],
                }
            ]
        return None

    def _interrupt(self) -> None:
        """SIGINT the kernel's process group (the sandbox's launcher relays it)."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        if process is not None:
            try:
                group = os.getpgid(process.pid)
                if group != os.getpgid(0):  # never the grader's own group
                    os.killpg(group, signal.SIGINT)
            except OSError:
                pass


def _defined_names(nb) -> set[str]:
    names = set()
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        names |= {
            n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)
        }
    return names


def detect_chapter(nb) -> str | None:
    """The chapter whose graded cells and exercise names this notebook shares most."""
    grade_ids = {
        c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells
    }
    names = _defined_names(nb)
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


def _is_test_cell(cell) -> bool:
    """An nbgrader test cell: ours to judge, never run (its code comes from the course)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


def _probe_setup_cell() -> str:
    source = Path(probe.__file__).read_text()
    return (
        "import torch.overrides, torch.utils._python_dispatch\n"
        "import types as _grader_types\n"
        "_grader_probe = _grader_types.ModuleType('_grader_probe')\n"
        f"exec(compile({source!r}, '<grader probe>', 'exec'), _grader_probe.__dict__)\n"
    )


@dataclass
class _Run:
    """What happened while the notebook ran, for the messages."""

    errors: list[str]
    died_in_cell: int | None = (
        None  # the student's code cell during which the kernel died
    )
    died_in_test: bool = (
        False  # the kernel died while a hidden test called student code
    )


def _run_notebook(
    nb,
    prepared: list[PreparedTest],
    km,
    workdir: Path,
    limits: Limits,
    skip: frozenset[str] = frozenset(),
) -> tuple[list[list[dict] | None], _Run]:
    """Execute the student's code cells, then one probe cell per hidden test; returns each
    test's raw outcomes (None where the probe wrote nothing) and what went wrong."""
    code = [c for c in nb.cells if c.get("cell_type") == "code"]
    # which cells run, with their numbers among the notebook's code cells (for messages)
    numbers = [
        n + 1
        for n, c in enumerate(code)
        if not _is_test_cell(c) and c.source not in skip
    ]
    student = [nbformat.v4.new_code_cell(code[n - 1].source) for n in numbers]
    probes, result_paths = [nbformat.v4.new_code_cell(_probe_setup_cell())], []
    for i, p in enumerate(prepared):
        plan, result = workdir / f"plan_{i}.pt", workdir / f"result_{i}.pt"
        torch.save([p.probe_plan], plan)
        result_paths.append(result)
        call = f"_grader_probe.run_files({str(plan)!r}, {str(result)!r}, globals())"
        probes.append(nbformat.v4.new_code_cell(call))

    deadline = time.monotonic() + limits.notebook
    current = {
        "index": -1
    }  # the cell being run, set by nbclient before it asks for a timeout

    def on_cell_start(cell, cell_index):
        current["index"] = cell_index

    def timeout_for(cell) -> int:
        if current["index"] >= len(student):
            return max(1, int(limits.test))
        return max(1, int(min(limits.cell, deadline - time.monotonic())))

    client = _QuietClient(
        nbformat.v4.new_notebook(cells=student + probes),
        km=km,
        timeout_func=timeout_for,
        on_cell_start=on_cell_start,
        startup_timeout=int(limits.startup),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={"ename": "TimeoutError", "evalue": "past its time limit"},
        kernel_name="python3",
        extra_arguments=["--log-level=ERROR"],
        resources={"metadata": {"path": str(workdir)}},
    )
    client.output_limit = int(limits.output_mb * 2**20)
    run = _Run(errors=[])
    # A cell that ignores interrupts cannot outlast this: the kernel is shut down.
    hard_stop = limits.notebook + limits.test * len(prepared) + limits.startup + 30
    watchdog = threading.Timer(hard_stop, lambda: kill_kernel(km))
    watchdog.start()
    try:
        client.execute(env=_kernel_environment())
    except DeadKernelError:
        if current["index"] < len(student):
            run.died_in_cell = numbers[current["index"]]
        else:
            run.died_in_test = True
    except Exception as exc:  # noqa: BLE001 (nbclient's own failures become messages)
        run.errors.append(
            f"the notebook could not be run: {type(exc).__name__}: {exc}"[:300]
        )
    finally:
        watchdog.cancel()
    if client.flooded_cell is not None:
        where = (
            f"code cell {numbers[client.flooded_cell]}"
            if client.flooded_cell < len(student)
            else "a hidden test"
        )
        run.errors.append(
            f"{where} printed more than {limits.output_mb:g} MB and was interrupted"
        )
    for i, cell in enumerate(client.nb.cells[: len(student)]):
        for out in cell.get("outputs", []):
            if out.get("ename") in (
                "TimeoutError",
                "KeyboardInterrupt",
            ):  # only our limits interrupt
                run.errors.append(
                    f"code cell {numbers[i]} ran past its time limit and was interrupted"
                )
            else:
                run.errors.append(
                    f"code cell {numbers[i]}: {out.get('ename')}: {out.get('evalue')}"
                )
    return [_read_result(path, limits) for path in result_paths], run


def _read_result(path: Path, limits: Limits) -> list[dict] | None:
    """A probe's saved outcomes; None when it wrote none or the file is not a clean result."""
    try:
        if not path.is_file() or path.stat().st_size > limits.result_mb * 2**20:
            return None
        return torch.load(path, weights_only=True)[0]
    except Exception:  # noqa: BLE001 (whatever student code did to the file, it is no result)
        return None


def _kernel_environment() -> dict[str, str]:
    """The student's kernel gets no path to the course's code, and draws no figures."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JPY_PARENT_PID")
    }
    env["MPLBACKEND"] = (
        "Agg"  # plt.show() becomes a no-op: figures cost time and are not graded
    )
    return env


def _missing_reason(run: _Run) -> str:
    if run.died_in_cell is not None:
        return (
            f"no result: the kernel died while running code cell {run.died_in_cell} of "
            "your notebook (os._exit, a crash, or running out of memory), so nothing after it ran"
        )
    if run.died_in_test:
        return (
            "no result: the kernel died while the hidden tests called your code "
            "(os._exit, a crash, or running out of memory)"
        )
    return "no result: the test did not finish within its time limit, or your code stopped it"


def grade_notebook(
    path: Path | str,
    assignment: str | None = None,
    seed: int | None = None,
    limits: Limits | None = None,
    sandbox: Sandbox | Unsandboxed | None = None,
) -> dict:
    """Grade one notebook; never raises for anything the submission does. Without a
    ``sandbox``, starts one for this notebook alone (``grade_many`` shares one)."""
    if sandbox is None:
        with Sandbox(limits or Limits(), hide=[Path(path).resolve().parent]) as own:
            return grade_notebook(path, assignment, seed, limits, own)
    limits = limits or sandbox.limits
    seed = secrets.randbits(32) if seed is None else seed
    result = {
        "notebook": str(path),
        "assignment": None,
        "score": 0.0,
        "max_score": 0.0,
        "tests": [],
        "seed": seed,
        "message": "",
    }
    tests = _set_assignment(result, assignment) if assignment else None
    try:
        nb = nbformat.read(path, as_version=4)
        detected = detect_chapter(nb)  # also fails on cells that are not cells
    except Exception as exc:  # noqa: BLE001 (any unreadable file gets a grade and a message)
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        return _ungraded(
            result,
            f"could not read the notebook ({why})",
            "the notebook could not be read",
        )
    if tests is None:
        if detected is None:
            return _ungraded(
                result,
                "could not recognise the chapter of this notebook; pass --assignment",
                "",
            )
        tests = _set_assignment(result, detected)
    notes = []
    if detected is not None and detected != tests.chapter:
        notes.append(
            f"this notebook looks like chapter {detected}, not {tests.chapter}"
        )
    try:
        verdicts, run = _grade(nb, tests, seed, limits, sandbox)
    except Exception as exc:  # noqa: BLE001 (a grader bug must not stop the batch)
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        return _ungraded(
            result,
            f"the grader failed on this notebook ({why}); please report this to the course staff",
            "the grader failed on this notebook",
        )
    result["tests"] = [v.as_json() for v in verdicts]
    result["score"] = float(sum(v.score for v in verdicts))
    if run.died_in_cell is not None or run.died_in_test:
        notes.append(_missing_reason(run))
    if run.errors:
        notes.append(
            f"{len(run.errors)} problem(s) while running, first: {run.errors[0]}"
        )
    result["message"] = "; ".join(notes)
    return result


def _set_assignment(result: dict, chapter: str) -> ChapterTests:
    """The assignment fixes the tests and ``max_score``, whatever the submission holds."""
    tests = load_chapter_tests(chapter)
    result["assignment"] = chapter
    result["max_score"] = tests.max_score
    result["tests"] = [
        Verdict(t.id, t.points, False, "not graded").as_json() for t in tests.tests
    ]
    return tests


def _ungraded(result: dict, message: str, why: str) -> dict:
    result["message"] = f"{message}; nothing was graded"
    for t in result["tests"]:
        t["message"] = f"not graded: {why}"
    return result


def _given_cells(tests: ChapterTests) -> list:
    """The released notebook's code cells other than the exercises (the course's own)."""
    try:
        release = nbformat.read(release_notebook(tests.chapter), as_version=4)
    except OSError:
        return []
    return [
        c
        for c in release.cells
        if c.cell_type == "code"
        and not c.get("metadata", {}).get("nbgrader", {}).get("solution", False)
    ]


def _demo_sources(tests: ChapterTests) -> frozenset[str]:
    """Given cells tagged ``demo`` (training runs, benchmarks, figures): not needed to
    grade, so skipped while unchanged. A chapter's demo cells define nothing the
    exercises need."""
    return frozenset(
        c.source for c in _given_cells(tests) if "demo" in c.metadata.get("tags", [])
    )


def _student_sources(nb, tests: ChapterTests) -> list[str]:
    """The student's own code: every code cell except the course's unchanged ones."""
    given = {c.source for c in _given_cells(tests)}
    return [
        c.source
        for c in nb.cells
        if c.get("cell_type") == "code" and c.source not in given
    ]


def _refuse_delegation(verdicts: list[Verdict], nb, tests: ChapterTests) -> None:
    """A test whose exercise reaches a forbidden PyTorch feature in its code earns nothing."""
    sources = _student_sources(nb, tests)
    for i, v in enumerate(verdicts):
        test = tests.test(v.test_id)
        found = delegation.static_uses(sources, test.exercise, test.forbidden)
        if found:
            where = "found in its code"
            verdicts[i] = Verdict(
                v.test_id,
                v.points,
                False,
                delegation.message(test.exercise, found, where),
            )


def _grade(
    nb, tests: ChapterTests, seed: int, limits: Limits, sandbox
) -> tuple[list[Verdict], _Run]:
    prepared = prepare(tests, tests.tests, seed)
    with sandbox.kernel() as (km, workdir):
        got, run = _run_notebook(
            nb, prepared, km, workdir, limits, _demo_sources(tests)
        )
    reason = _missing_reason(run)
    verdicts = [
        judge(tests, p.test, p.cases, p.plans, p.expected, g, reason)
        for p, g in zip(prepared, got, strict=True)
    ]
    _refuse_delegation(verdicts, nb, tests)
    return verdicts, run


def grade_many(
    paths: list[Path],
    assignment: str | None = None,
    jobs: int = 1,
    seed: int | None = None,
    limits: Limits | None = None,
    sandboxed: bool = True,
) -> Iterator[dict]:
    """Grade notebooks ``jobs`` at a time, each in a fresh kernel forked from one warm
    sandbox; yields results in the order of ``paths``."""
    seed = secrets.randbits(32) if seed is None else seed
    limits = limits or Limits()
    folders = sorted({Path(p).resolve().parent for p in paths})
    sandbox = Sandbox(limits, hide=folders) if sandboxed else Unsandboxed(limits)
    with sandbox, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [
            pool.submit(grade_notebook, p, assignment, seed, limits, sandbox)
            for p in paths
        ]
        for future in futures:
            yield future.result()

"""nbgrader's ``autograde`` with our grader in place of its ``Execute`` step.

``autograder/nbgrader_config.py`` puts :class:`SandboxedExecute` where nbgrader runs the
notebook, so ``nbgrader autograde <assignment>`` keeps nbgrader's whole workflow (cells
restored from the source, scores saved in the gradebook, ``generate_feedback``,
``export``) while the student's code runs in the sandbox and each test cell's outcome is
our verdict: a passed test gets a line of output, a failed one an error whose message is
the feedback. The test cells' own code is never run.

:func:`run_hidden_test` is what those test cells would run under nbgrader's own
``Execute`` (student code and check in one process). Only the benchmark uses it, as the
baseline of plain nbgrader.
"""

from __future__ import annotations

import atexit
import secrets
import tempfile
import threading
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor

_SANDBOX = None
_LOCK = threading.Lock()


def _shared_sandbox():
    """One warm sandbox per nbgrader process, for all the submissions it grades."""
    global _SANDBOX
    with _LOCK:
        if _SANDBOX is None:
            from autograder.sandbox import Sandbox

            _SANDBOX = Sandbox()
            atexit.register(_SANDBOX.close)
        return _SANDBOX


def _is_test_cell(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


class SandboxedExecute(NbGraderPreprocessor):
    """Grade the notebook with ``autograder.grade`` and write each verdict into its cell."""

    def preprocess(self, nb, resources):
        from autograder.grade import grade_notebook

        assignment = resources["nbgrader"]["assignment"]
        with tempfile.TemporaryDirectory(prefix="autograde-") as tmp:
            path = Path(tmp) / "submission.ipynb"
            nbformat.write(nb, path)
            result = grade_notebook(path, assignment, sandbox=_shared_sandbox())
        if result["message"]:
            self.log.warning("%s", result["message"])
        verdicts = {t["id"]: t for t in result["tests"]}
        for cell in nb.cells:
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if cell.cell_type != "code" or not _is_test_cell(cell):
                continue
            verdict = verdicts.get(grade_id)
            if verdict is None:
                message = f"not graded: {assignment} has no hidden test {grade_id!r}"
                verdict = {"passed": False, "message": message}
            if verdict["passed"]:
                cell.outputs = [
                    nbformat.v4.new_output(
                        "stream", name="stdout", text=f"✓ {verdict['message']}\n"
                    )
                ]
            else:
                cell.outputs = [
                    nbformat.v4.new_output(
                        "error",
                        ename="HiddenTestFailed",
                        evalue=verdict["message"],
                        traceback=[f"HiddenTestFailed: {verdict['message']}"],
                    )
                ]
        return nb, resources


def run_hidden_test(
    chapter: str, test_id: str, namespace: dict, seed: int | None = None
) -> None:
    from autograder.judge import judge
    from autograder.prepare import prepare
    from autograder.probe import run
    from autograder.spec import load_chapter_tests

    tests = load_chapter_tests(chapter)
    test = tests.test(test_id)
    seed = secrets.randbits(32) if seed is None else seed
    (p,) = prepare(tests, [test], seed)
    got = run(namespace, [p.probe_plan])[0]
    verdict = judge(tests, test, p.cases, p.plans, p.expected, got)
    if not verdict.passed:
        raise AssertionError(verdict.message)
    print(f"✓ {test_id}: {verdict.message}")

"""nbgrader's ``autograde`` with our grader in place of its ``Execute`` step.

``autograder/course/nbgrader_config.py`` puts :class:`SandboxedExecute` where nbgrader runs the
notebook, so ``nbgrader autograde <assignment>`` keeps nbgrader's whole workflow (cells
restored from the source, scores saved in the gradebook, ``generate_feedback``,
``export``) while the student's code runs in the sandbox and each test cell's outcome is
our verdict: a passed test gets a line of output, a failed one an error whose message is
the feedback. The test cells' own code is never run.

A grader fault is never recorded as a grade: :func:`prove_sandbox` (nbgrader's
``pre_convert_hook``) proves the jail before the first submission and stops nbgrader with
exit status 3 and one message if it cannot start; a submission whose grading a grader
fault spoiled even after a second try raises, so nbgrader records nothing for it (and
the gradebook entry this run created for it is removed again).

Each graded submission's provenance (the course version and the assignment's digest,
``provenance.py``) goes into the gradebook's table ``autograder_provenance`` and into a
note at the top of the autograded notebook, so the feedback page shows it; its verdicts
go into the table ``autograder_verdicts`` (``verdict_record.py``) for the class report.

A student's recording is complete only once nbgrader's post-convert hook
(:func:`recorded_hook`) writes their completion mark (``completion.py``), which the
pre-convert hook deleted before nbgrader touched them; ``generate_feedback``'s hooks
(:func:`feedback_hook`) do the same for the page. A stop in between leaves no mark, and
``python -m autograder autograde`` records the student again.

``python -m autograder autograde`` (``autograde.py``) grades a whole class in parallel
first and then runs ``nbgrader autograde`` with the results in a file named by the
environment variable ``AUTOGRADER_VERDICTS``: a submission whose restored cells are the
ones graded there (the same :func:`~autograder.grading.running.student_code.grading_key`) is recorded from the
file, not run again; any other is graded here as usual.

:func:`run_hidden_test` is what those test cells would run under nbgrader's own
``Execute`` (student code and check in one process). Only the benchmark uses it, as the
baseline of plain nbgrader.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import secrets
import sqlite3
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor
from traitlets import Integer

from autograder.grading.recording.stop_points import stop_point
from autograder.grading.running.student_code import is_test_cell

_SANDBOX = None
_LOCK = threading.Lock()
COURSE_ID = "attention-course"  # nbgrader_config.py's CourseDirectory.course_id


def course_config(root: Path):
    """The course's settings, ``root/nbgrader_config.py``, as nbgrader's apps read them."""
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()


_NEW_SUBMISSIONS: set[tuple[str, str]] = set()  # (assignment, student) this run created
VERDICTS = "AUTOGRADER_VERDICTS"  # results graded beforehand, one JSON line per student
# (assignment, student) -> the id of the result being recorded, for the completion mark
_RECORDED_FROM: dict[tuple[str, str], str] = {}


def _graded_beforehand(path: str) -> dict[tuple[str, str], dict]:
    """The results ``python -m autograder autograde`` wrote, by (assignment, student):
    read once per file (and again if it changes), not once per notebook."""
    stat = os.stat(path)
    signature = (path, stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if _BEFOREHAND[0] != signature:
        _BEFOREHAND[:] = [signature, _read_results(path)]
    return _BEFOREHAND[1]


_BEFOREHAND: list = [None, {}]  # the file last read: its signature, its results


def _read_results(path: str) -> dict[tuple[str, str], dict]:
    results = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                results[r["assignment"], r["student"]] = r
    return results


def _shared_sandbox():
    """One warm, proven sandbox per nbgrader process, for all the submissions it grades."""
    global _SANDBOX
    with _LOCK:
        if _SANDBOX is None:
            from autograder.grading.running.preflight import prove
            from autograder.grading.running.sandbox import Sandbox

            sandbox = Sandbox()
            atexit.register(sandbox.close)
            prove(sandbox)
            _SANDBOX = sandbox
        return _SANDBOX


class GraderUnavailable(SystemExit):
    """Exit status 3, with the diagnosis as its message: formgrader (nbgrader's API) shows
    the exception that stopped nbgrader, not what was printed to stderr."""

    def __init__(self, message: str):
        super().__init__(3)
        self.message = message

    def __str__(self) -> str:
        return self.message


def prove_sandbox(assignment, student, notebooks, db_url=None, course_id=None, **_):
    """nbgrader's pre-convert hook, run before each submission is entered in the
    gradebook: start and prove the jail (once), or stop nbgrader with exit status 3 and
    the diagnosis before anything is recorded. Also notes whether the submission is
    new to the gradebook, so a grader fault can take its entry out again."""
    from autograder.grading.running.sandbox import SandboxUnavailable

    try:
        if not os.environ.get(VERDICTS):  # else proven when a notebook must be run here
            _shared_sandbox()
    except SandboxUnavailable as exc:
        print(f"[autograder] {exc}", file=sys.stderr, flush=True)
        raise GraderUnavailable(f"[autograder] {exc}") from None
    for notebook in notebooks:  # .../submitted/<student>/<assignment>/<name>.ipynb
        parts = Path(notebook).parts
        if db_url and len(parts) >= 3:
            with Gradebook(db_url, course_id) as gb:
                try:
                    gb.find_submission(parts[-2], parts[-3])
                except MissingEntry:
                    _NEW_SUBMISSIONS.add((parts[-2], parts[-3]))
            _recording_begins(db_url, parts[-2], parts[-3])


def _owner(notebooks) -> tuple[str, str] | None:
    """(assignment, student) of the notebooks nbgrader converts for one student:
    ``.../<student>/<assignment>/<name>.ipynb`` (submitted/, autograded/)."""
    for notebook in notebooks:
        parts = Path(notebook).parts
        if len(parts) >= 3:
            return parts[-2], parts[-3]
    return None


def _recording_begins(db_url: str, assignment: str, student: str) -> None:
    """The student's completion mark goes before nbgrader writes anything for them
    (``completion.py``); if it cannot, nbgrader stops: a mark left in place would
    vouch for a record this run may leave half written."""
    from autograder.grading.recording import completion, provenance

    path = provenance.db_path(db_url)
    if path is None:
        return
    try:
        completion.clear(path, assignment, student)
    except sqlite3.Error as exc:
        message = f"[autograder] cannot clear {student}'s completion mark ({exc})"
        print(message, file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def recorded_hook(assignment, student, notebooks, db_url=None, **_):
    """nbgrader's post-convert hook for ``autograde``, run once nbgrader has recorded a
    student completely (the gradebook, the autograded notebook, the provenance):
    the student's completion mark (``completion.py``), with the id of the result
    recorded. A failure here only leaves the student to be recorded again."""
    from autograder.grading.recording import completion, provenance

    owner = _owner(notebooks)
    path = provenance.db_path(db_url) if db_url else None
    if owner is None or path is None:
        return
    assignment, student = owner
    sha = completion.sha256(Path(notebooks[0]).parent / f"{assignment}.ipynb")
    completion.mark_recorded(
        path, assignment, student, sha, _RECORDED_FROM.pop(owner, None)
    )


def feedback_hook(assignment, student, notebooks, db_url=None, done=False, **_):
    """nbgrader's pre- (``done`` False) and post-convert (``done`` True) hooks for
    ``generate_feedback``: the student's page is being written, or was written."""
    from autograder.grading.recording import completion, provenance

    owner = _owner(notebooks)
    path = provenance.db_path(db_url) if db_url else None
    if owner is not None and path is not None:
        completion.mark_feedback(path, *owner, done=done)


class SandboxedExecute(NbGraderPreprocessor):
    """Grade the notebook with ``autograder.grading.grade`` and write each verdict into its cell."""

    seed = Integer(
        None,
        allow_none=True,
        help="seed of the hidden tests' inputs (default: drawn for each submission)",
    ).tag(config=True)

    def preprocess(self, nb, resources):
        from autograder.grading.running.student_code import (
            grading_key,  # light: no torch
        )

        assignment = resources["nbgrader"]["assignment"]
        student = resources["nbgrader"].get("student")
        result = None
        if os.environ.get(VERDICTS):
            result = _graded_beforehand(os.environ[VERDICTS]).get((assignment, student))
            if result is not None:  # what this recording stands for, even graded again
                _RECORDED_FROM[assignment, student] = result.get("result_id")
            if result is not None and result.get("key") != grading_key(nb):
                self.log.warning(
                    "[autograder] %s: the cells nbgrader restored differ from the ones "
                    "graded beforehand (a locked cell was edited): graded again here",
                    student,
                )
                result = None
        if result is None:
            result = self._grade_here(nb, resources["nbgrader"], assignment)
            _RECORDED_FROM.setdefault((assignment, student), uuid.uuid4().hex)
        if not result["graded"]:
            self._forget(resources["nbgrader"], assignment)
            _record_verdicts(resources["nbgrader"], assignment, result)
            raise RuntimeError(f"[autograder] {result['message']}")
        if result["message"]:
            self.log.warning("%s", result["message"])
        # one line per submission at INFO (formgrader's log, nbgrader's default); the
        # student's code reaches the log only at DEBUG, from the kernel's client
        passed = sum(1 for t in result["tests"] if t.get("passed"))
        self.log.info(
            "[autograder] %s: graded in the course's sandbox: %g/%g points, %d of %d "
            "hidden tests passed",
            student, result["score"], result["max_score"], passed, len(result["tests"]),
        )  # fmt: skip
        self._record_provenance(nb, resources["nbgrader"], assignment, result)
        _record_verdicts(resources["nbgrader"], assignment, result)
        # a test's hard kill (stop_points.py): the gradebook holds the submission and
        # the provenance, not yet the scores
        stop_point("gradebook", student)
        verdicts = {t["id"]: t for t in result["tests"]}
        for cell in nb.cells:
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if cell.cell_type != "code" or not is_test_cell(cell):
                continue
            verdict = verdicts.get(grade_id)
            if verdict is None:
                message = f"not graded: {assignment} has no hidden test {grade_id!r}"
                verdict = {"passed": False, "message": message}
            cell.outputs = test_cell_outputs(verdict)
        return nb, resources

    def _record_provenance(self, nb, info: dict, assignment: str, result: dict) -> None:
        """What graded it: a row in the gradebook's provenance table (a warning when the
        student was graded before under another digest) and a note at the top of the
        autograded notebook, which the feedback page shows."""
        from autograder.grading.recording import provenance

        student, db_url = info.get("student"), info.get("db_url")
        if db_url and student:
            before = provenance.recorded(db_url, assignment).get(student)
            if before and before["digest"] != result.get("digest"):
                self.log.warning(
                    "[autograder] %s: re-graded under another digest: was course "
                    "version %s, digest %s; now %s",
                    student,
                    before["course_version"],
                    provenance.short(before["digest"]),
                    provenance.describe(result),
                )
            provenance.record_in_gradebook(db_url, assignment, student, result)
        note = nbformat.v4.new_markdown_cell(provenance.feedback_note(result))
        note.metadata["autograder"] = "provenance"
        note.id = "autograder-provenance"
        nb.cells = [
            c
            for c in nb.cells
            if c.get("metadata", {}).get("autograder") != "provenance"
        ]
        nb.cells.insert(0, note)

    def _grade_here(self, nb, info: dict, assignment: str) -> dict:
        from autograder.grading.grade import grade_notebook
        from autograder.grading.running.sandbox import SandboxUnavailable

        try:
            sandbox = _shared_sandbox()
        except SandboxUnavailable as exc:  # proven only now: record nothing for it
            self._forget(info, assignment)
            raise RuntimeError(f"[autograder] {exc}") from None
        with tempfile.TemporaryDirectory(prefix="autograde-") as tmp:
            path = Path(tmp) / "submission.ipynb"
            nbformat.write(nb, path)
            return grade_notebook(path, assignment, self.seed, sandbox=sandbox)

    def _forget(self, info: dict, assignment: str) -> None:
        """Remove the gradebook entry this run created for a submission it could not
        grade (an earlier run's grades, if any, stay as they were)."""
        student = info.get("student")
        if (assignment, student) in _NEW_SUBMISSIONS and info.get("db_url"):
            with Gradebook(info["db_url"], COURSE_ID) as gb:
                gb.remove_submission(assignment, student)


class RestoreHiddenTests(NbGraderPreprocessor):
    """Put back the hidden tests that ``generate_assignment`` cleared from a test cell, in
    a submission whose cell is exactly as released, before nbgrader's ``OverwriteCells``
    compares it with the source (nbgrader issue #1961).

    The gradebook keeps each locked cell's checksum as the *source* has it, hidden tests
    included, while the student's copy holds only the released comments; so, without
    this, ``OverwriteCells`` logs "Attribute 'checksum' for cell ... has changed!" for
    every hidden-test cell of every untouched submission, which reads like a real edit.
    A cell the student did edit still differs from the released text: it is left as it
    is, and ``OverwriteCells`` logs the change and restores it, as before."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        self._notebook, self._assignment = info["notebook"], info["assignment"]
        self._clear = ClearHiddenTests(parent=self)  # the release's own delimiters
        with Gradebook(info["db_url"]) as self._gradebook:
            return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id is None or not is_test_cell(cell):
            return cell, resources
        try:
            source = self._gradebook.find_source_cell(
                grade_id, self._notebook, self._assignment
            )
        except MissingEntry:
            return cell, resources  # OverwriteCells reports it
        # the source's cell, cleared as generate_assignment cleared it for the release
        released = copy.deepcopy(cell)
        released.source = source.source
        self._clear.preprocess_cell(released, resources, cell_index)
        if cell.source == released.source:
            cell.source = source.source
        return cell, resources


def _record_verdicts(info: dict, assignment: str, result: dict) -> None:
    """Every verdict of the grade, or why there is none, for the class report
    (``verdict_record.py``)."""
    from autograder.grading.recording import provenance, verdict_record

    student, db_url = info.get("student"), info.get("db_url")
    path = provenance.db_path(db_url) if db_url else None
    if not (path and student):
        return
    if result["graded"]:
        verdict_record.record_graded(path, assignment, student, result)
    else:
        verdict_record.record_attempt(
            path, assignment, student, verdict_record.NOT_GRADED, result["message"]
        )


def test_cell_outputs(verdict: dict) -> list:
    """What a test cell of the autograded notebook shows (the feedback page shows it
    too): a pass, or the failure as an error; then, on a line of its own, a remark on
    the code, which took no point."""
    if verdict["passed"]:
        outputs = [
            nbformat.v4.new_output(
                "stream", name="stdout", text=f"✓ {verdict['message']}\n"
            )
        ]
    else:
        outputs = [
            nbformat.v4.new_output(
                "error",
                ename="HiddenTestFailed",
                evalue=verdict["message"],
                traceback=[f"HiddenTestFailed: {verdict['message']}"],
            )
        ]
    if verdict.get("remark"):
        outputs.append(
            nbformat.v4.new_output(
                "stream", name="stdout", text=f"{verdict['remark']}\n"
            )
        )
    return outputs


def run_hidden_test(
    chapter: str, test_id: str, namespace: dict, seed: int | None = None
) -> None:
    """One hidden test judged inside the student's kernel, student code and check in one
    process, as plain nbgrader would run a test cell: the benchmark's baseline. The
    verdict is the grader's own; the code it reads is the kernel's input history."""
    from autograder.grading.judging.judge import verdict
    from autograder.grading.judging.prepare import prepare
    from autograder.grading.judging.spec import load_chapter_tests
    from autograder.grading.running.student_code import StudentCode, given_sources
    from autograder.grading.sealed.probe import run_test

    tests = load_chapter_tests(chapter)
    seed = secrets.randbits(32) if seed is None else seed
    (p,) = prepare(tests, [tests.test(test_id)], seed)
    code = StudentCode(
        [s for s in namespace.get("In", []) if s], given_sources(chapter)
    )
    found = verdict(tests, p, run_test(namespace, p.test_plan), code)
    if not found.passed:
        raise AssertionError(found.message)
    print(f"✓ {test_id}: {found.message}")

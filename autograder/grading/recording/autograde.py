"""A whole class graded in parallel into nbgrader's gradebook (``python -m autograder
autograde``), and split across machines (``--shard K/N``, then ``merge``).

Two steps. First every collected submission that ``nbgrader autograde`` would grade is
graded by one warm sandbox on ``jobs`` workers (``grade.grade_many``: the hidden tests'
inputs and the reference's outputs are drawn once for the batch). The results go to a file
of JSON lines, one per student, each with the fingerprint of the cells it graded
(``student_code.grading_key``). Then nbgrader's own ``nbgrader autograde`` runs over the same
submissions with that file (``nbgrader_bridge.VERDICTS``): it restores the locked cells
from the source, writes the ``autograded/`` copies, records scores, timestamps and late
penalties as it always does, and takes each verdict from the file instead of running the
notebook again. A submission whose restored cells differ from the ones graded (a student
edited a locked cell) is graded there, as serial nbgrader would. A submission the grader
could not grade (a grader fault) is left out of the gradebook and listed.

The two steps overlap: while the class is graded, one recording worker at a lower CPU
priority records the students graded so far, in the time the grading leaves idle
(:class:`RecordingAhead`); once the grading ends, the rest are recorded on every worker.

With ``--shard K/N`` only the first step runs, on the students whose shard is K; each
shard writes its own file and ``python -m autograder merge ASSIGNMENT FILE...`` records
them all into one gradebook.

A stop loses nothing and records nothing wrong. Each verdict goes to a journal as it is
made (:class:`Journal`, one fsync'd line per notebook: ``runs/<assignment>.jsonl`` in the
course root, or the shard's results file with ``.partial`` appended); SIGINT and SIGTERM
end the run once the notebooks being graded are done (:func:`stop_on_signals`), and
the next run takes each journal line whose submission and digest are unchanged instead
of grading it again. A student counts as recorded only when nbgrader's recording of
them completed (``completion.py``): a run stopped or killed in the middle of one is
recorded again (:func:`plan`), with ``nbgrader autograde --force`` replacing the half
record. The journal goes once a run completes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from contextlib import contextmanager
from pathlib import Path

from autograder.grading.running.limits import Limits
from autograder.paths import COURSE_ROOT, env_with_repo_on_path

# The progress bar names the submission running longest once it has run this long (a
# chapter's notebook takes seconds), and is redrawn this often while nothing finishes.
RUNS_LONG_SECONDS = 10.0
WATCH_SECONDS = 2.0


def in_shard(student: str, shard: int, shards: int) -> bool:
    """Shard ``shard`` (1 .. ``shards``) of a class: fixed by the student's id alone, so
    every machine agrees whatever else was collected."""
    return zlib.crc32(student.encode()) % shards == shard - 1


def _timestamp(folder: Path):
    from nbgrader.coursedir import CourseDirectory

    return CourseDirectory().get_existing_timestamp(str(folder))


def submissions(
    root: Path, assignment: str, students: list[str] | None = None, force: bool = False
) -> dict[str, Path]:
    """The submitted notebook of each student that ``nbgrader autograde`` would grade
    now: not yet autograded, resubmitted since, or everyone with ``force``."""
    found = {}
    name = f"{assignment}.ipynb"
    for notebook in sorted((root / "submitted").glob(f"*/{assignment}/{name}")):
        student = notebook.parent.parent.name
        if students and student not in students:
            continue
        done = root / "autograded" / student / assignment
        if done.exists() and not force:
            new, old = _timestamp(notebook.parent), _timestamp(done)
            if not (new and old and new > old):
                continue  # nbgrader would skip it: "Skipping existing assignment"
        found[student] = notebook
    return found


def journal_path(root: Path, assignment: str) -> Path:
    """Where a class run keeps its verdicts until they are recorded."""
    return root / "runs" / f"{assignment}.jsonl"


def plan(
    root: Path,
    assignment: str,
    students: list[str] | None,
    force: bool,
    feedback: bool,
    kept: dict[str, dict],
) -> tuple[dict[str, Path], list[str], list[str]]:
    """``(to_record, already, pages)``: the submitted notebook of each student to
    record now, the students whose recording is complete, and those of them whose
    feedback page a stopped ``--feedback`` run did not write. A student is recorded
    when nbgrader's recording of them completed (their completion mark,
    ``completion.py``, for this very file) and nbgrader would skip them (not
    resubmitted since; ``force``: never); one with a result ``kept`` from a stopped run,
    when that result is the one recorded. Anyone else, a half record included, is
    recorded again."""
    from autograder.grading.recording import completion

    marks = completion.read(root / "gradebook.db", assignment)
    nbgrader_would = submissions(root, assignment, students, force)
    to_record, already, pages = {}, [], []
    for student, notebook in submissions(root, assignment, students, True).items():
        mark = marks.get(student)
        result = kept.get(student)
        if mark is None:
            done = False
        elif result is not None:
            done = mark["result_id"] == result["result_id"]
            if done and feedback and mark["feedback_at"] is None:
                pages.append(student)
        else:
            done = student not in nbgrader_would and mark["submission_sha256"] in (
                None,
                completion.sha256(notebook),
            )
        if done:
            already.append(student)
        else:
            to_record[student] = notebook
    return to_record, already, pages


def recorded_already(
    root: Path, assignment: str, results: list[dict], feedback: bool
) -> tuple[list[dict], list[str], list[str]]:
    """``merge``: the results still to record, the students recorded from the very
    result given (a merge stopped and run again), and those of them whose feedback
    page is still to write."""
    from autograder.grading.recording import completion

    marks = completion.read(root / "gradebook.db", assignment)
    left, already, pages = [], [], []
    for r in results:
        mark = marks.get(r["student"])
        if (
            mark is not None
            and r.get("result_id")
            and mark["result_id"] == r["result_id"]
        ):
            already.append(r["student"])
            if feedback and mark["feedback_at"] is None:
                pages.append(r["student"])
        else:
            left.append(r)
    return left, already, pages


def progress_line(already: list[str], pages: list[str]) -> str:
    """``N already recorded`` (and how many of them still lack their feedback page)."""
    line = f"{len(already)} already recorded"
    if pages:
        line += f" ({len(pages)} without their feedback page yet: written now)"
    return line


class Stopped(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM (a scheduler's kill) reached the class run."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stopped_by(stop: KeyboardInterrupt) -> tuple[str, int]:
    """The signal's name and the exit status (130, 143: as a shell reports the signal).
    A plain KeyboardInterrupt is SIGINT (Python's own handler: a second Ctrl-C, or one
    that came where some library had put it back)."""
    signum = getattr(stop, "signum", signal.SIGINT)
    return signal.Signals(signum).name, 128 + signum


def _stop(signum, frame):
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    raise Stopped(signum)


@contextmanager
def stop_on_signals():
    """SIGINT and SIGTERM raise :class:`Stopped` (a KeyboardInterrupt) in the main
    thread: the run stops cleanly, keeping what it finished. A second signal ends it at
    once (nothing is lost: the journal is on disk). The grader proves its jail in a
    thread (``grade._in_a_thread``), so nbclient leaves these handlers alone."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, _stop)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def grade_class(
    notebooks: dict[str, Path],
    assignment: str,
    jobs: int,
    seed: int | None,
    limits: Limits,
    progress: bool = True,
    timings: dict | None = None,
    journal: Journal | None = None,
    on_graded=None,
) -> list[dict]:
    """Grade every student's notebook in one warm sandbox; each result also names the
    student, the fingerprint of the cells it graded (``key``), the submitted file's
    sha256 and an id of its own (``result_id``), and goes to ``journal`` as soon as it is
    made, then to ``on_graded`` (:class:`RecordingAhead`). ``timings`` gets the seconds
    the grader took to start (``grade_many``)."""
    from tqdm import tqdm

    from autograder.grading.recording.stop_points import STOP_AT, stop_point
    from autograder.grading.running.sandbox import Sandbox

    students = list(notebooks)
    if not students:
        return []
    by_path = {str(notebooks[s]): s for s in students}
    bar = tqdm(
        total=len(students), desc=f"grading {assignment}", unit="notebook",
        disable=not progress, file=sys.stderr,
    )  # fmt: skip
    so_far = dict.fromkeys(("full", "zero", "problems", "not graded"), 0)
    running: dict[str, float] = {}  # student -> when a worker took the notebook up

    def show() -> None:
        """The counts, and the submission running longest once it runs long (a loop
        waiting out its time limit, say): the instructor sees who holds a worker."""
        postfix = {}
        now = time.monotonic()
        if running:
            student, since = min(running.items(), key=lambda item: item[1])
            if now - since >= RUNS_LONG_SECONDS:
                postfix["running long"] = f"{student} {now - since:.0f} s"
        bar.set_postfix({**postfix, **so_far}, refresh=True)

    def started_one(path: Path) -> None:
        student = by_path.get(str(path))
        if student is not None:
            running[student] = time.monotonic()

    def graded_one(result: dict) -> None:
        """Kept at once; the bar shows how the class is doing while it runs, not only
        how far it is."""
        student = by_path.get(result.get("notebook"))
        running.pop(student, None)
        if student is not None:
            _annotate(result, student, notebooks[student], assignment, limits)
            if journal is not None:
                journal.append(result)
                if STOP_AT in os.environ:  # tests only (stop_points.py)
                    stop_point("graded", str(journal.written))
            if on_graded is not None:
                on_graded(result)
        for kind, counts in _kinds(result).items():
            so_far[kind] += counts
        bar.update()
        show()

    done = threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_SECONDS):
            show()

    watcher = threading.Thread(target=watch, daemon=True)
    paths = [notebooks[s] for s in students]
    sandbox = None
    try:
        # the jail's warm process preloads PyTorch (seconds) on one core while this
        # process imports it with the grader on another: started before that import
        sandbox = Sandbox.for_notebooks(paths, limits)
        from autograder.grading.grade import grade_many

        if progress:
            watcher.start()
        results = list(
            grade_many(
                paths, assignment, jobs, seed, limits, on_result=graded_one,
                timings=timings, on_start=started_one, sandbox=sandbox,
            )
        )  # fmt: skip
    except BaseException:
        if sandbox is not None:
            sandbox.close()  # closed already where grade_many began
        raise
    finally:
        done.set()
        bar.close()
    for student, result in zip(students, results, strict=True):
        if "result_id" not in result:
            _annotate(result, student, notebooks[student], assignment, limits)
    return results


def _annotate(
    result: dict, student: str, notebook: Path, assignment: str, limits: Limits
) -> None:
    """What a result needs to be recorded, and kept across a stop: the student, the
    fingerprint of the cells graded, the submitted file's sha256, the limits and an id."""
    import nbformat

    from autograder.grading.grade import restored
    from autograder.grading.recording.completion import sha256
    from autograder.grading.running.student_code import grading_key

    result["student"] = student
    try:
        # the cells graded: the read-only ones as restored, as nbgrader will have them
        submitted = nbformat.read(notebook, as_version=4)
        result["key"] = grading_key(restored(submitted, assignment))
    except Exception:  # noqa: BLE001 (unreadable: nbgrader will not record it either)
        result["key"] = None
    result["submission_sha256"] = sha256(notebook)
    result["limits"] = _limits_key(limits)
    result["result_id"] = uuid.uuid4().hex


def _limits_key(limits: Limits) -> str:
    import dataclasses

    return json.dumps(dataclasses.asdict(limits), sort_keys=True, default=str)


class Journal:
    """Every verdict of a run, one JSON line each, flushed to disk as it is made, so a
    stop (even a hard kill) keeps every notebook graded; the next run takes them back
    (:meth:`kept`) instead of grading them again. A line cut short by a kill is skipped."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.written = 0

    def load(self) -> dict[str, dict]:
        """The last result per student in the journal (empty when there is none)."""
        found = {}
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return found
        for line in lines:
            try:
                result = json.loads(line)
                found[result["student"]] = result
            except (ValueError, KeyError, TypeError):
                continue  # cut short by a kill
        return found

    def kept(
        self,
        notebooks: dict[str, Path],
        assignment: str,
        seed: int | None,
        limits: Limits,
    ) -> dict[str, dict]:
        """The journal's verdicts that still hold for ``notebooks``: graded, for the same
        file (sha256), assignment digest, course version, limits and, with ``seed``, seed."""
        from autograder.grading.recording.completion import sha256
        from autograder.grading.recording.provenance import assignment_digest
        from autograder.paths import course_version

        found = self.load()
        if not found:
            return {}
        digest, version = assignment_digest(assignment), course_version()
        limits_key = _limits_key(limits)
        kept = {}
        for student, r in found.items():
            notebook = notebooks.get(student)
            if (
                notebook is not None
                and r.get("graded")
                and r.get("assignment") == assignment
                and r.get("result_id")
                and r.get("digest") == digest
                and r.get("course_version") == version
                and r.get("limits") == limits_key
                and (seed is None or r.get("seed") == seed)
                and r.get("submission_sha256") == sha256(notebook)
            ):
                kept[student] = r
        return kept

    def start(self, kept: list[dict]) -> None:
        """Begin this run's journal with what it keeps from the last one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            for result in kept:
                f.write(json.dumps(result) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._file = open(self.path, "a")  # noqa: SIM115 (open for the whole run)

    def append(self, result: dict) -> None:
        self._file.write(json.dumps(result) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.written += 1

    def close(self) -> None:
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """The run completed: nothing left to keep."""
        self.close()
        self.path.unlink(missing_ok=True)
        if self.path.parent.name == "runs":  # the course root's, when nothing is left
            try:
                self.path.parent.rmdir()
            except OSError:
                pass


def _kinds(result: dict) -> dict[str, bool]:
    """Which of the progress bar's counts a result adds to."""
    graded = result["graded"]
    return {
        "full": graded and result["score"] == result["max_score"],
        "zero": graded and result["score"] == 0,
        "problems": graded and "problem(s) while running" in result["message"],
        "not graded": not graded,
    }


def write_results(results: list[dict], path: Path) -> None:
    """All at once (a new file, renamed over ``path``): a stop never leaves it half
    written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for result in results:
            f.write(json.dumps(result) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_results(paths: list[Path]) -> list[dict]:
    """Every result in the shards' files; a student graded twice keeps the last."""
    by_student = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    result = json.loads(line)
                    by_student[result["assignment"], result["student"]] = result
    return list(by_student.values())


def _in_gradebook(root: Path, assignment: str) -> bool:
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.nbgrader_bridge import COURSE_ID

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        try:
            return bool(gb.find_assignment(assignment).notebooks)
        except MissingEntry:
            return False


def _nbgrader(root: Path, *args: str) -> int:
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=root,
        env=env_with_repo_on_path(),
    ).returncode


def enter_assignment(root: Path, assignment: str, in_process: bool = False) -> int:
    """Put the assignment and its graded cells in the gradebook if they are not there
    (what ``nbgrader generate_assignment`` does), without touching ``release/``."""
    if _in_gradebook(root, assignment):
        return 0
    return _generate(root, assignment, in_process)


def _generate(root: Path, assignment: str, in_process: bool = False) -> int:
    print(f"[autograder] entering {assignment} in the gradebook", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="release-") as release:
        args = [
            "generate_assignment", assignment, "--force",
            f"--CourseDirectory.release_directory={release}",
        ]  # fmt: skip
        if in_process:  # run in the course root
            from autograder.grading.recording.nbgrader_steps import run_step

            return run_step(args)
        return _nbgrader(root, *args)


class Entering:
    """:func:`enter_assignment` in a process of its own, started now (it takes the core
    the grader's start leaves idle); :meth:`result` waits for its exit status and
    prints its log if it failed."""

    def __init__(self, root: Path, assignment: str):
        self._log = tempfile.TemporaryFile("w+")
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "autograder.grading.recording.autograde", assignment],
            cwd=root, env=env_with_repo_on_path(), text=True,
            stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,  # a stop lets it finish: never half entered
        )  # fmt: skip

    def result(self) -> int:
        with self._lock:  # asked by the run and by RecordingAhead: its log shown once
            status = self._process.wait()
            if status and not self._log.closed:
                self._log.seek(0)
                print(self._log.read(), file=sys.stderr, end="")
            self._log.close()
            return status


def record(
    root: Path,
    assignment: str,
    results: list[dict],
    force: bool,
    jobs: int = 1,
    feedback: bool = False,
    timings: dict | None = None,
    pages: list[str] = (),
    nice: int = 0,
    running: list | None = None,
    worker: RecordingWorker | None = None,
) -> int:
    """Run ``nbgrader autograde`` over the graded students only, taking their verdicts
    from ``results``, on ``jobs`` workers at once (each a process of its own over a part
    of the class: ``nbgrader_steps``); with ``feedback``, each worker then runs
    ``nbgrader generate_feedback --force`` over its part, and over its share of
    ``pages`` (students recorded whose page a stop left unwritten). Returns the largest
    exit status; ``timings`` (if given) gets each step's seconds summed over the workers
    and the workers' wall time. ``nice`` lowers the workers' CPU priority; ``running``
    (if given) gets each worker's process as it starts, for a stop to end it. A
    ``worker`` (if given) records on one worker in place of a new process."""
    from autograder.grading.recording.completion import ensure

    _record_attempts_without_grade(root, assignment, results)
    graded = sorted({r["student"] for r in results if r["graded"]})
    pages = sorted(set(pages) - set(graded)) if feedback else []
    ensure(root / "gradebook.db")  # its completion marks (completion.py)
    if not graded and not pages:
        return 0
    everyone = sorted(
        p.parent.name for p in (root / "submitted").glob(f"*/{assignment}")
    )
    workers = max(1, min(jobs, len(graded) + len(pages)))
    if workers > 1 and graded:
        _enter_students(root, graded)
    shares = [(graded + pages)[k::workers] for k in range(workers)]
    parts = [[s for s in share if s in graded] for share in shares]
    page_parts = [[s for s in share if s not in graded] for share in shares]
    seeds = {r["seed"] for r in results}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="verdicts-") as tmp:
        verdicts = Path(tmp) / "verdicts.jsonl"
        write_results([r for r in results if r["graded"]], verdicts)

        def exclude(part):
            others = sorted(set(everyone) - set(part))
            if not others:
                return []
            return [f"--CourseDirectory.student_id_exclude={','.join(others)}"]

        commands = []
        for k, part in enumerate(parts):
            args = []
            if part:
                # every student handed over is recorded, replacing any record it has:
                # resubmitted, a half record a stop left, or all of them with ``force``
                args = ["autograde", assignment, *exclude(part), "--force"]
                if (
                    len(seeds) == 1
                ):  # a notebook graded again there draws the same inputs
                    args.append(f"--SandboxedExecute.seed={next(iter(seeds))}")
            if feedback:  # the pages of the students just recorded, made again
                mine = part + page_parts[k]
                args += ["--then", "generate_feedback", assignment, "--force"]
                args += exclude(mine)
            commands.append(args)
        if worker is not None and workers == 1:
            status, steps = worker.run(commands[0], verdicts)
            step_lists = [steps]
        else:
            status, step_lists = _run_workers(
                root, commands, verdicts, Path(tmp), nice, running
            )
        if timings is not None:
            timings["workers"] = workers
            timings["seconds"] = time.perf_counter() - started
            for steps in step_lists:
                for name, seconds in steps:
                    timings[name] = timings.get(name, 0.0) + seconds
    _record_attempts_without_grade(root, assignment, results, after_nbgrader=True)
    return status


def _run_workers(
    root: Path, commands: list[list[str]], verdicts: Path, tmp: Path, nice: int,
    running: list | None,
) -> tuple[int, list[list]]:  # fmt: skip
    """One recording worker (``nbgrader_steps``) a command line, all at once: the
    largest exit status, and each worker's steps with their seconds."""
    from autograder.grading.nbgrader_bridge import VERDICTS

    processes = []
    for k, args in enumerate(commands):
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "autograder.grading.recording.nbgrader_steps",
                    "--timings",
                    str(tmp / f"timings-{k}.json"),
                    *(["--nice", str(nice)] if nice else []),
                    *args,
                ],
                cwd=root,
                env={**env_with_repo_on_path(), VERDICTS: str(verdicts)},
            )  # fmt: skip
        )
        if running is not None:
            running.append(processes[-1])
    try:
        status = max(_exit_status(process.wait()) for process in processes)
    except KeyboardInterrupt:  # a stop: each worker ends after its clean-up
        _stop_workers(processes)
        raise
    step_lists = []
    for k in range(len(commands)):
        try:
            step_lists.append(json.loads((tmp / f"timings-{k}.json").read_text()))
        except (OSError, ValueError):
            continue
    return status, step_lists


def _exit_status(returncode: int) -> int:
    """A worker's exit status as a shell gives it: 128 + N where signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode


class RecordingWorker:
    """One recording worker that stays up (``nbgrader_steps --serve``) and records one
    run of students after another: Python and nbgrader start once, not once a run."""

    def __init__(self, root: Path, nice: int = 0):
        read, write = os.pipe()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "autograder.grading.recording.nbgrader_steps",
                    *(["--nice", str(nice)] if nice else []), "--serve", str(write),
                ],
                cwd=root, env=env_with_repo_on_path(), stdin=subprocess.PIPE,
                pass_fds=(write,), text=True,
            )  # fmt: skip
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self._replies = os.fdopen(read)

    def run(self, argv: list[str], verdicts: Path) -> tuple[int, list]:
        """Record with the steps of ``argv`` (as ``nbgrader_steps`` takes them): the
        exit status (128 + N if signal N stopped the worker), and the steps' seconds."""
        request = json.dumps({"argv": argv, "verdicts": str(verdicts)})
        try:
            self.process.stdin.write(request + "\n")
            self.process.stdin.flush()
            line = self._replies.readline()
        except OSError:  # it ended: a stop, or killed
            line = ""
        if not line:
            return self.close() or 1, []
        reply = json.loads(line)
        return reply["status"], reply["timings"]

    def close(self) -> int:
        """No more runs: the worker's exit status once it has ended."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        status = _exit_status(self.process.wait())
        self._replies.close()
        return status


# Recording starts beside the grading once this many students, next in id order, are
# graded: each run of them costs a request to the worker that stays up, and whatever is
# left when the grading ends is recorded after it, while nothing else runs.
RECORD_AHEAD_AT = 20
RECORD_AHEAD_NICE = 10
RECORD_AHEAD_AT_VARIABLE = "AUTOGRADER_RECORD_AHEAD_AT"  # tests only: a smaller run


class RecordingAhead:
    """Records a class while it is still being graded, in the time the grading leaves
    idle: a kernel waits on its own start and end, on the jail and on the hidden tests'
    hand-over, and a core stands idle while a slow notebook sleeps. One recording worker
    that stays up for the run (:class:`RecordingWorker`, at a lower CPU priority) takes
    the students graded since it last took some, once there are ``at`` of them; what is
    left when the grading ends is recorded as before, on every worker.

    It starts once the assignment is in the gradebook (``entering``). Before its first
    recording it reads each student's previous grade (:attr:`previous`, for the
    summary) and enters every student of the run in id order, the order one recording
    would enter them in (:func:`_enter_students`); :meth:`tidy` removes again those it
    created whose submission was never recorded (a grader fault)."""

    def __init__(
        self, root: Path, assignment: str, students: list[str], feedback: bool,
        entering: Entering, at: int | None = None,
    ):  # fmt: skip
        self.root, self.assignment, self.feedback = root, assignment, feedback
        self.order = sorted(students)
        if at is None:
            at = int(os.environ.get(RECORD_AHEAD_AT_VARIABLE, RECORD_AHEAD_AT))
        self.at, self.entering = max(1, at), entering
        self.results: dict[str, dict] = {}  # graded, not yet taken
        self.recorded: set[str] = set()  # handed to a recording worker that ended
        self.previous: dict[str, dict] | None = None
        self.status, self.timings, self.running = 0, {}, []
        self.worker: RecordingWorker | None = None  # started at its first recording
        self.entered: list[str] = []  # students it created in the gradebook
        self.taking: set[str] = set()  # handed to the recording worker running now
        self.begun = threading.Event()  # :attr:`previous` read, the students entered
        self._lock, self._wake = threading.Lock(), threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def add(self, result: dict) -> None:
        """A result just graded (or kept from a stopped run)."""
        with self._lock:
            self.results[result["student"]] = result
        self._wake.set()

    def _take(self) -> list[dict]:
        """The students graded and not yet taken, if there are ``at`` of them."""
        with self._lock:
            if self._closing or len(self.results) < self.at:
                return []
            taken, self.results = list(self.results.values()), {}
            self.taking = {r["student"] for r in taken}
            return taken

    def _work(self) -> None:
        if self.entering.result() != 0:  # the run says so, and records nothing
            return
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            taken = self._take()
            if not taken:
                continue
            try:
                if self.previous is None:
                    self.previous = previous_provenance(self.root, self.assignment)
                    self.entered = _enter_students(self.root, self.order)
            finally:
                self.begun.set()
            try:
                if self.worker is None:
                    self.worker = RecordingWorker(self.root, RECORD_AHEAD_NICE)
                    self.running.append(self.worker.process)
                status = record(
                    self.root, self.assignment, taken, True, 1, self.feedback,
                    self.timings, worker=self.worker,
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 (they are recorded after the grading)
                print(
                    f"[autograder] recording beside the grading failed ({exc!r:.200}): "
                    "its students are recorded once the grading ends",
                    file=sys.stderr,
                )
                return
            if status >= 128:  # stopped or killed: the run stops, or records them again
                return
            self.status = max(self.status, status)
            with self._lock:
                self.recorded |= self.taking
                self.taking = set()
            if self._closing:
                return
            self._wake.set()  # more may be ready already

    def finish(self) -> set[str]:
        """Take no more; the students of the recording under way, if any (the run
        records the others beside it, once :attr:`previous` is read)."""
        with self._lock:
            self._closing = True
            taking = set(self.taking)
        self._wake.set()
        if taking:
            self.begun.wait()
        return taking

    def close(self) -> None:
        """Take no more; wait for the recording under way, and for its worker to end."""
        self.finish()
        self._thread.join()
        if self.worker is not None:
            self.worker.close()

    def tidy(self) -> None:
        """Once every student is recorded: no student entered here without a grade."""
        if self.entered:
            _remove_unrecorded(self.root, self.entered)

    def stop(self) -> None:
        """A stop: the recording worker ends after nbgrader's clean-up (the student
        it was recording is recorded again on the next run)."""
        self._closing = True
        self._wake.set()
        _stop_workers(self.running)
        self._thread.join(timeout=90)


def _stop_workers(processes: list[subprocess.Popen], grace: float = 60.0) -> None:
    """SIGTERM to each recording worker still running (after Ctrl-C they have had
    SIGINT already, and ignore a second signal), then wait; SIGKILL past ``grace``."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _enter_students(root: Path, students: list[str]) -> list[str]:
    """Enter the students in the gradebook in the order serial ``nbgrader autograde``
    enters them (by id), as it does (``update_or_create_student`` with nothing more),
    before the workers run: else they enter them in the order they happen to finish,
    and lists ordered by name (``nbgrader export``'s rows, for one) come out in another
    order where the gradebook has no names. Only where nbgrader would create them
    (``Autograde.create_student``, on by default), as ``add_student`` would create
    them, in one transaction rather than one each (a class of 500 took seconds).
    Returns those it created."""
    from nbgrader.api import Gradebook, Student

    from autograder.grading.nbgrader_bridge import COURSE_ID, course_config

    config = course_config(root)
    if not config.get("Autograde", {}).get("create_student", True):
        return []
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        there = {s.id for s in gb.students}
        new = [s for s in students if s not in there]
        for student in new:  # in this order: SQLAlchemy inserts them in it
            gb.db.add(Student(id=student))
        gb.db.commit()
    return new


def _remove_unrecorded(root: Path, students: list[str]) -> None:
    """Students entered ahead of their recording (:class:`RecordingAhead`) who have no
    submission in the gradebook after all (the grader could not grade theirs): gone
    again, so that no export shows them with 0 points."""
    from nbgrader.api import Gradebook

    from autograder.grading.nbgrader_bridge import COURSE_ID

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        for student in students:
            if not gb.find_student(student).submissions:
                gb.remove_student(student)


def _record_attempts_without_grade(
    root: Path, assignment: str, results: list[dict], after_nbgrader: bool = False
) -> None:
    """For the class report: the submissions not graded (a grader fault), and after
    nbgrader ran, those it could not process (``not_autograded``)."""
    from autograder.grading.recording import verdict_record as vr

    path = root / "gradebook.db"
    if not after_nbgrader:
        for r in results:
            if not r["graded"]:
                vr.record_attempt(
                    path, assignment, r["student"], vr.NOT_GRADED, r["message"]
                )
        return
    for student in not_autograded(root, assignment, results):
        why = "nbgrader could not process this submission (no autograded copy)"
        message = next(r["message"] for r in results if r["student"] == student)
        vr.record_attempt(
            path, assignment, student, vr.NOT_AUTOGRADED,
            "; ".join(filter(None, (why, message))),
        )  # fmt: skip


def not_autograded(root: Path, assignment: str, results: list[dict]) -> list[str]:
    """Students graded here whose autograded copy nbgrader did not write (it could not
    read or process the notebook: its log above says why)."""
    name = f"{assignment}.ipynb"
    return sorted(
        r["student"]
        for r in results
        if r["graded"]
        and not (root / "autograded" / r["student"] / assignment / name).is_file()
    )


def previous_provenance(root: Path, assignment: str) -> dict[str, dict]:
    """What graded each student's recorded grade so far (the gradebook's provenance
    table): read before recording, for :func:`summary`."""
    from autograder.grading.recording.provenance import recorded

    return recorded(root / "gradebook.db", assignment)


def recorded_scores(root: Path, assignment: str) -> dict[str, dict]:
    """Each student's score as the gradebook records it after ``nbgrader autograde``:
    ``score`` (after nbgrader's late penalty, as ``nbgrader export`` has it),
    ``penalty`` and ``late`` (submitted after the due date)."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.nbgrader_bridge import COURSE_ID

    scores = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        try:
            submissions = gb.find_assignment(assignment).submissions
        except MissingEntry:
            return scores
        for sub in submissions:
            penalty = sub.late_submission_penalty or 0.0
            scores[sub.student_id] = {
                "score": max(sub.score - penalty, 0.0),
                "penalty": penalty,
                "late": sub.total_seconds_late > 0,
            }
    return scores


def _as_recorded(results: list[dict], recorded: dict[str, dict] | None) -> list[dict]:
    """``results`` with each graded score replaced by the gradebook's (late penalty
    taken), where the gradebook has one."""
    if recorded is None:
        return results
    out = []
    for r in results:
        entry = recorded.get(r["student"]) if r["graded"] else None
        if entry is not None:
            r = {**r, "graded_score": r["score"], "score": entry["score"]}
            r.update(late=entry["late"], penalty=entry["penalty"])
        out.append(r)
    return out


PHASES = ("kernel start", "student cells", "tests", "kernel end")


def time_line(grading: float, recording: float, timings: dict, results: list) -> str:
    """Where the time went: the grader's start, the notebooks' phases (summed over the
    workers: ``grade._phases``), recording and feedback (summed over their workers)."""
    phases = {name: 0.0 for name in PHASES}
    for r in results:
        for name, seconds in (r.get("phases") or {}).items():
            phases[name] = phases.get(name, 0.0) + seconds
    line = f"time: {grading:.1f} s grading"
    if "start" in timings:
        line += f" (start {timings['start']:.1f} s; summed over the notebooks: "
        line += ", ".join(f"{name} {s:.1f} s" for name, s in phases.items()) + ")"
    line += f", {recording:.1f} s recording in the gradebook"
    if timings.get("workers"):
        steps = [
            f"{name} {timings[name]:.1f} s"
            for name in ("autograde", "generate_feedback")
            if name in timings
        ]
        line += f" on {timings['workers']} worker(s) ({', '.join(steps)}, summed)"
    if timings.get("ahead"):
        line += f"; {timings['ahead']} of them recorded beside the grading"
    return line


def summary(
    results: list[dict],
    slowest: int = 5,
    previous: dict[str, dict] | None = None,
    recorded: dict[str, dict] | None = None,
) -> str:
    """A short table for the instructor: what graded them (course version and digest),
    how many were graded, full marks, zero, late, with problems while running, not
    graded, the slowest submissions, the late ones, and the students re-graded under
    another digest than the one their recorded grade had (``previous``:
    ``previous_provenance``). Scores are the gradebook's (``recorded``:
    :func:`recorded_scores`, after the late penalty) where it has them."""
    from autograder.grading.recording.provenance import regraded, short

    results = _as_recorded(results, recorded)
    graded = [r for r in results if r["graded"]]
    stamps = sorted(
        {(r.get("course_version"), r.get("digest")) for r in graded},
        key=lambda s: tuple(map(str, s)),
    )
    rows = [
        ("submissions", len(results)),
        ("graded", len(graded)),
        ("full marks", sum(r["score"] == r["max_score"] for r in graded)),
        ("zero", sum(r["score"] == 0 for r in graded)),
        ("late (after the due date)", sum(bool(r.get("late")) for r in graded)),
        ("problems while running", sum("problem(s) while running" in r["message"] for r in graded)),
        ("not graded (grader fault: grade again)", len(results) - len(graded)),
        ("flagged for review (no points taken)", sum(bool(r.get("flags")) for r in graded)),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    lines = [
        f"graded by: course version {version}, digest {short(digest)}"
        for version, digest in stamps
    ]
    if len(stamps) > 1:
        lines.append(
            "WARNING: these results were graded under different digests (shards run "
            "at different versions of the course?)"
        )
    lines += [f"{name:<{width}}  {count}" for name, count in rows]
    again = regraded(previous or {}, results)
    if previous is not None:
        lines.append(f"{'re-graded under another digest':<{width}}  {len(again)}")
    ranked = sorted(results, key=lambda r: -r.get("seconds", 0))[:slowest]
    if ranked:
        lines.append("slowest:")
        lines += [
            f"  {r['student']:<20} {r.get('seconds', 0):7.1f} s  {r['score']:g}/{r['max_score']:g}"
            + (" late" if r.get("late") else "")
            for r in ranked
        ]
    for r in graded:
        if r.get("late"):
            lines.append(
                f"LATE {r['student']}: {r['score']:g}/{r['max_score']:g} recorded "
                f"({r['graded_score']:g} graded, late penalty {r['penalty']:g})"
            )
    for r in results:
        if not r["graded"]:
            lines.append(f"NOT GRADED {r['student']}: {r['message']}")
    for r in graded:
        if r.get("flags"):
            lines.append(f"FOR REVIEW {r['student']}: {'; '.join(r['flags'][:5])}")
    return "\n".join(lines + again)


def course_root(path: Path | None) -> Path:
    """The nbgrader course root: the one given, else this course's ``autograder/course/``."""
    root = (path or COURSE_ROOT).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise SystemExit(
            f"{root} is not an nbgrader course root (no nbgrader_config.py)"
        )
    return root


if __name__ == "__main__":  # in the course root: enter ASSIGNMENT (``Entering``)
    sys.exit(enter_assignment(Path.cwd(), sys.argv[1], in_process=True))

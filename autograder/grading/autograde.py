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

With ``--shard K/N`` only the first step runs, on the students whose shard is K; each
shard writes its own file and ``python -m autograder merge ASSIGNMENT FILE...`` records
them all into one gradebook.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from autograder.grading.limits import Limits
from autograder.paths import COURSE_ROOT, env_with_repo_on_path


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


def grade_class(
    notebooks: dict[str, Path],
    assignment: str,
    jobs: int,
    seed: int | None,
    limits: Limits,
    progress: bool = True,
    timings: dict | None = None,
) -> list[dict]:
    """Grade every student's notebook in one warm sandbox; each result also names the
    student and the fingerprint of the cells it graded. ``timings`` gets the seconds
    the grader took to start (``grade_many``)."""
    import nbformat
    from tqdm import tqdm

    from autograder.grading.grade import grade_many, restored
    from autograder.grading.student_code import grading_key

    students = list(notebooks)
    bar = tqdm(
        total=len(students), desc=f"grading {assignment}", unit="notebook",
        disable=not progress, file=sys.stderr,
    )  # fmt: skip
    so_far = dict.fromkeys(("full", "zero", "problems", "not graded"), 0)

    def graded_one(result: dict) -> None:
        """The bar shows how the class is doing while it runs, not only how far it is."""
        for kind, counts in _kinds(result).items():
            so_far[kind] += counts
        bar.set_postfix(so_far, refresh=False)
        bar.update()

    try:
        results = list(
            grade_many(
                [notebooks[s] for s in students], assignment, jobs, seed, limits,
                on_result=graded_one, timings=timings,
            )
        )  # fmt: skip
    finally:
        bar.close()
    for student, result in zip(students, results, strict=True):
        result["student"] = student
        try:
            # the cells graded: the read-only ones as restored, as nbgrader will have them
            submitted = nbformat.read(notebooks[student], as_version=4)
            result["key"] = grading_key(restored(submitted, assignment))
        except Exception:  # noqa: BLE001 (unreadable: nbgrader will not record it either)
            result["key"] = None
    return results


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
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for result in results:
            f.write(json.dumps(result) + "\n")


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
            from autograder.grading.nbgrader_steps import run_step

            return run_step(args)
        return _nbgrader(root, *args)


class Entering:
    """:func:`enter_assignment` in a process of its own, started now (it takes the core
    the grader's start leaves idle); :meth:`result` waits for its exit status and
    prints its log if it failed."""

    def __init__(self, root: Path, assignment: str):
        self._log = tempfile.TemporaryFile("w+")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "autograder.grading.autograde", assignment],
            cwd=root, env=env_with_repo_on_path(), text=True,
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def result(self) -> int:
        status = self._process.wait()
        if status:
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
) -> int:
    """Run ``nbgrader autograde`` over the graded students only, taking their verdicts
    from ``results``, on ``jobs`` workers at once (each a process of its own over a part
    of the class: ``nbgrader_steps``); with ``feedback``, each worker then runs
    ``nbgrader generate_feedback --force`` over its part. Returns the largest exit
    status; ``timings`` (if given) gets each step's seconds summed over the workers and
    the workers' wall time."""
    _record_attempts_without_grade(root, assignment, results)
    graded = sorted({r["student"] for r in results if r["graded"]})
    if not graded:
        return 0
    everyone = sorted(
        p.parent.name for p in (root / "submitted").glob(f"*/{assignment}")
    )
    workers = max(1, min(jobs, len(graded)))
    if workers > 1:
        _enter_students(root, graded)
    parts = [graded[k::workers] for k in range(workers)]
    seeds = {r["seed"] for r in results}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="verdicts-") as tmp:
        verdicts = Path(tmp) / "verdicts.jsonl"
        write_results([r for r in results if r["graded"]], verdicts)
        from autograder.grading.nbgrader_bridge import VERDICTS

        processes = []
        for k, part in enumerate(parts):
            others = sorted(set(everyone) - set(part))
            exclude = (
                [f"--CourseDirectory.student_id_exclude={','.join(others)}"]
                if others
                else []
            )
            args = ["autograde", assignment, *exclude]
            if force:
                args.append("--force")
            if len(seeds) == 1:  # a notebook graded again there draws the same inputs
                args.append(f"--SandboxedExecute.seed={next(iter(seeds))}")
            if feedback:  # the pages of the students just recorded, made again
                args += ["--then", "generate_feedback", assignment, "--force", *exclude]
            processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "autograder.grading.nbgrader_steps",
                        "--timings",
                        str(Path(tmp) / f"timings-{k}.json"),
                        *args,
                    ],
                    cwd=root,
                    env={**env_with_repo_on_path(), VERDICTS: str(verdicts)},
                )  # fmt: skip
            )
        status = max(process.wait() for process in processes)
        if timings is not None:
            timings["workers"] = workers
            timings["seconds"] = time.perf_counter() - started
            for k in range(workers):
                try:
                    steps = json.loads((Path(tmp) / f"timings-{k}.json").read_text())
                except (OSError, ValueError):
                    continue
                for name, seconds in steps:
                    timings[name] = timings.get(name, 0.0) + seconds
    _record_attempts_without_grade(root, assignment, results, after_nbgrader=True)
    return status


def _enter_students(root: Path, students: list[str]) -> None:
    """Enter the students in the gradebook in the order serial ``nbgrader autograde``
    enters them (by id), as it does (``update_or_create_student`` with nothing more),
    before the workers run: else they enter them in the order they happen to finish,
    and lists ordered by name (``nbgrader export``'s rows, for one) come out in another
    order where the gradebook has no names. Only where nbgrader would create them
    (``Autograde.create_student``, on by default)."""
    from nbgrader.api import Gradebook
    from traitlets.config.loader import PyFileConfigLoader

    from autograder.grading.nbgrader_bridge import COURSE_ID

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    if not config.get("Autograde", {}).get("create_student", True):
        return
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        for student in students:
            gb.update_or_create_student(student)


def _record_attempts_without_grade(
    root: Path, assignment: str, results: list[dict], after_nbgrader: bool = False
) -> None:
    """For the class report: the submissions not graded (a grader fault), and after
    nbgrader ran, those it could not process (``not_autograded``)."""
    from autograder.grading import verdict_record as vr

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
    from autograder.grading.provenance import recorded

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
    from autograder.grading.provenance import regraded, short

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
    """The nbgrader course root: the one given, else this course's ``autograder/``."""
    root = (path or COURSE_ROOT).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise SystemExit(
            f"{root} is not an nbgrader course root (no nbgrader_config.py)"
        )
    return root


if __name__ == "__main__":  # in the course root: enter ASSIGNMENT (``Entering``)
    sys.exit(enter_assignment(Path.cwd(), sys.argv[1], in_process=True))

"""The class report of a synthetic class, timed.

    python benchmarks/class_report.py [--class-size 500] [--keep DIR]

Writes a gradebook (nbgrader's ``Gradebook`` API, and the course's verdict tables through
``verdict_record``) of ``--class-size`` students, each with a submission of every graded
assignment, in a realistic mix: most hidden tests passed; failures that match a known
mistake, failures that match none (a few messages), a delegation refusal now and then,
submissions that hit a time limit and a few not graded at all. Then times
``python -m autograder report`` on one assignment (the target: 500 submissions in under
30 s on 2 cores) and on all of them (the class-wide form with its heat map), and prints
the figures. Building the gradebook is not timed.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder.grading.judging.spec import graded_chapters, load_chapter_tests  # noqa: E402
from autograder.grading.nbgrader_bridge import COURSE_ID  # noqa: E402
from autograder.grading.recording import verdict_record as vr  # noqa: E402
from autograder.paths import COURSE_ROOT  # noqa: E402

UNMATCHED = [
    "`{e}` case {i} of 4: raised NotImplementedError.",
    "`{e}` case {i} of 4: the output: expected shape (2, 5, 8), got (2, 8, 5).",
    "`{e}` case {i} of 4: the output: max error {x:.3g} (tolerance 1e-05).",
]


def _verdict(test, tests, rng: random.Random) -> dict:
    points = float(test.points)
    v = {"id": test.id, "score": points, "max_score": points, "passed": True,
         "message": f"passed: {test.description}", "mistake": None, "refused": None}  # fmt: skip
    draw = rng.random()
    if draw < 0.7:
        return v
    v.update(score=0.0, passed=False)
    mistakes = tests.mistakes_for(test.exercise)
    if test.forbidden and draw > 0.985:
        v["refused"] = "sdpa (found in its code)"
        v["message"] = (
            f"`{test.exercise}` uses PyTorch's own attention (found in its code)."
        )
    elif mistakes and draw < 0.88:
        m = rng.choice(mistakes)
        v["mistake"] = m.name
        v["message"] = (
            f"`{test.exercise}` case 1 of 4: differs. Likely mistake: {m.hint}"
        )
    else:
        shape = rng.choice(UNMATCHED)
        v["message"] = shape.format(
            e=test.exercise, i=rng.randint(1, 4), x=rng.random()
        )
    return v


def synthetic_gradebook(root: Path, students: int, seed: int = 0) -> Path:
    from nbgrader.api import Gradebook

    rng = random.Random(seed)
    db = root / "gradebook.db"
    ids = [f"s{i:04d}" for i in range(students)]
    with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
        for student in ids:
            gb.add_student(student)
        for chapter in graded_chapters():
            tests = load_chapter_tests(chapter)
            gb.update_or_create_assignment(chapter)
            gb.add_notebook(chapter, chapter)
            for t in tests.tests:
                gb.add_grade_cell(
                    t.id, chapter, chapter, max_score=t.points, cell_type="code"
                )
            for student in ids:
                outcome = rng.random()
                if (
                    outcome < 0.01
                ):  # a grader fault: nothing recorded in nbgrader's tables
                    vr.record_attempt(db, chapter, student, vr.NOT_GRADED,
                                      "not graded: grader fault: the kernel was killed "
                                      "from outside. This is no grade: grade this notebook again")  # fmt: skip
                    continue
                verdicts = [_verdict(t, tests, rng) for t in tests.tests]
                sub = gb.add_submission(chapter, student)
                by_id = {v["id"]: v for v in verdicts}
                for grade in sub.notebooks[0].grades:
                    grade.auto_score = by_id[grade.name]["score"]
                    grade.needs_manual_grade = False
                gb.db.commit()
                message = (
                    "1 problem(s) while running, first: code cell 7 ran past its time "
                    "limit and was interrupted" if outcome > 0.98 else ""
                )  # fmt: skip
                vr.record_graded(
                    db, chapter, student, {"tests": verdicts, "message": message}
                )
    return db


def _timed(root: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "autograder", "report", *args, "--course-dir", str(root),
         "--out", str(root / "reports")],
        cwd=REPO, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--class-size", type=int, default=500)
    parser.add_argument(
        "--keep", type=Path, help="keep the course root and reports here"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="class-report-"))
    shutil.copy(COURSE_ROOT / "nbgrader_config.py", root)
    started = time.perf_counter()
    synthetic_gradebook(root, args.class_size)
    print(f"synthetic gradebook: {args.class_size} students x "
          f"{len(graded_chapters())} assignments, written in "
          f"{time.perf_counter() - started:.0f} s (not timed)")  # fmt: skip
    one = _timed(root, "03_self_attention")
    every = _timed(root, "all")
    n = args.class_size
    print(f"report of one assignment, {n} submissions: {one:.1f} s (target < 30 s)")
    print(f"class-wide report, {n * len(graded_chapters())} submissions: {every:.1f} s")
    if args.keep:
        shutil.copytree(root, args.keep, dirs_exist_ok=True)
    shutil.rmtree(root)


if __name__ == "__main__":
    main()

"""A class graded into nbgrader's gradebook, four ways, measured in the same run.

    python benchmarks/class_autograde.py [--class-size 200] [--serial-sample 20]

The class mixes what students hand in: filled in, unscaled, untouched, broken (a syntax
error) and, once, a slow one (a cell that sleeps 20 s). Each way starts from a fresh copy
of the course root with the same submissions, and ends with the scores in
``gradebook.db``:

1. ``python -m autograder autograde`` with 2 jobs, then ``nbgrader generate_feedback``;
2. the same with 1 job;
3. serial ``nbgrader autograde`` with this course's configuration (our sandbox, one
   submission after another);
4. plain ``nbgrader autograde`` (its own Execute: student code and hidden tests in one
   kernel beside the course files).

Ways 3 and 4 grade one submission at a time, so they are timed on the first
``--serial-sample`` submissions of the class (every kind included) and reported per
submission; give ``--serial-sample`` the class size to time them on the whole class.
Prints seconds per submission and the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from grading import KINDS, PLAIN_CONFIG  # noqa: E402

from autograder.grading.nbgrader_bridge import COURSE_ID  # noqa: E402
from autograder.paths import COURSE_ROOT  # noqa: E402
from tests.notebooks import student_notebook, write  # noqa: E402

CHAPTER = "03_self_attention"
CLASS_KINDS = {
    "filled": KINDS["filled"],
    "unscaled": KINDS["unscaled"],
    "untouched": KINDS["untouched"],
    "broken": lambda: student_notebook(
        CHAPTER, lambda s: s.replace("def causal_mask", "def causal_mask(:")
    ),
}


def slow():
    """Filled in, with a first answer cell that sleeps 20 s."""
    first = []

    def edit(source: str) -> str:
        first.append(source)
        return "import time\ntime.sleep(20)\n" + source if len(first) == 1 else source

    return student_notebook(CHAPTER, edit)


def make_class(folder: Path, size: int) -> dict[str, Path]:
    """``size`` submissions, the kinds in turn and one slow one."""
    kinds = list(CLASS_KINDS)
    notebooks = {}
    for i in range(size):
        kind = "slow" if i == 5 else kinds[i % len(kinds)]
        make = slow if kind == "slow" else CLASS_KINDS[kind]
        student = f"s{i:03d}_{kind}"
        notebooks[student] = write(make(), folder / f"{student}.ipynb")
    return notebooks


def course(base: Path, name: str, notebooks: dict[str, Path], plain=False) -> Path:
    root = base / name
    root.mkdir()
    config = (COURSE_ROOT / "nbgrader_config.py").read_text()
    if plain:
        config = PLAIN_CONFIG.format(root=str(root), repo=str(REPO))
    (root / "nbgrader_config.py").write_text(config)
    shutil.copytree(COURSE_ROOT / "source" / CHAPTER, root / "source" / CHAPTER)
    for student, notebook in notebooks.items():
        folder = root / "submitted" / student / CHAPTER
        folder.mkdir(parents=True)
        shutil.copy(notebook, folder / f"{CHAPTER}.ipynb")
    nbgrader(root, "generate_assignment", CHAPTER, "--force")
    return root


def run(cwd: Path, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip  (a broken submission makes nbgrader exit 1: that is expected)
    return time.perf_counter() - start


def nbgrader(root: Path, *args: str) -> float:
    return run(root, "-m", "nbgrader", *args)


def recorded(root: Path, course_id: str = COURSE_ID) -> int:
    """How many submissions the gradebook holds a score for."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", course_id) as gb:
        return len(gb.find_assignment(CHAPTER).submissions)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--class-size", type=int, default=200)
    parser.add_argument("--serial-sample", type=int, default=20)
    args = parser.parse_args(argv)
    rows = []  # (way, submissions, seconds)
    with tempfile.TemporaryDirectory(prefix="class-benchmark-") as tmp:
        base = Path(tmp)
        (base / "class").mkdir()
        everyone = make_class(base / "class", args.class_size)
        sample = dict(list(everyone.items())[: args.serial_sample])
        for jobs in (2, 1):
            root = course(base, f"jobs{jobs}", everyone)
            grading = run(
                REPO, "-m", "autograder", "autograde", CHAPTER, "--jobs", str(jobs),
                "--course-dir", str(root),
            )  # fmt: skip
            feedback = nbgrader(root, "generate_feedback", CHAPTER)
            rows.append(
                (f"autograder autograde --jobs {jobs}, + feedback", len(everyone),
                 grading + feedback, recorded(root))
            )  # fmt: skip
            print(f"  jobs {jobs}: grading {grading:.1f} s, feedback {feedback:.1f} s")
        root = course(base, "serial", sample)
        seconds = nbgrader(root, "autograde", CHAPTER)
        rows.append(
            (
                "nbgrader autograde, our config (serial)",
                len(sample),
                seconds,
                recorded(root),
            )
        )
        root = course(base, "plain", sample, plain=True)
        seconds = nbgrader(root, "autograde", CHAPTER, "--create")
        kept = recorded(root, "benchmark")
        rows.append(("plain nbgrader autograde", len(sample), seconds, kept))
    fastest = rows[0][2] / rows[0][1]
    print(
        f"{args.class_size} submissions of {CHAPTER} (kinds: {', '.join(CLASS_KINDS)}, one slow)"
    )
    print(
        f"{'way':45s} {'graded':>6s} {'recorded':>8s} {'total s':>8s} {'s/sub':>6s} {'vs --jobs 2':>11s}"
    )
    for way, n, total, kept in rows:
        per = total / n
        print(
            f"{way:45s} {n:6d} {kept:8d} {total:8.1f} {per:6.2f} {per / fastest:10.2f}x"
        )
    print(f"--jobs 2 is {rows[1][2] / rows[0][2]:.2f}x faster than --jobs 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())

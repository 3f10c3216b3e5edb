"""Grading speed on a batch: our warm sandbox against one process per submission and
against plain ``nbgrader autograde``, measured in the same run on the same submissions.

    python benchmarks/grading.py [--submissions 24] [--jobs 2] [--skip-nbgrader]

Prints seconds per submission for each way and the speed-ups. The batch mixes the answers
a class hands in: filled in, unscaled, untouched, a wrong mask convention. Plain nbgrader
runs in a throwaway copy of the course, with its own ``Execute`` (student code and hidden
tests in one kernel beside the course files: the way this project exists to avoid).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder.grading.grade import grade_many  # noqa: E402
from autograder.paths import COURSE_ROOT  # noqa: E402
from tests.notebooks import release_notebook, student_notebook, write  # noqa: E402

CHAPTER = "03_self_attention"
KINDS = {
    "filled": lambda: student_notebook(CHAPTER),
    "unscaled": lambda: student_notebook(
        CHAPTER, lambda s: s.replace(" / math.sqrt(d_k)", "")
    ),
    "untouched": lambda: release_notebook(CHAPTER),
    "inverted_mask": lambda: student_notebook(
        CHAPTER, lambda s: s.replace("masked_fill(~mask", "masked_fill(mask")
    ),
}


def make_batch(folder: Path, n: int) -> list[Path]:
    kinds = list(KINDS)
    paths = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        paths.append(write(KINDS[kind](), folder / f"student{i:03d}_{kind}.ipynb"))
    return paths


def ours(paths: list[Path], jobs: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    scores = [r["score"] for r in grade_many(paths, CHAPTER, jobs=jobs, seed=1)]
    return time.perf_counter() - start, scores


def one_process_each(paths: list[Path], jobs: int) -> float:
    """A fresh grader process (and so a fresh sandbox and kernel) per submission."""

    def grade(path: Path) -> None:
        subprocess.run(
            [sys.executable, "-m", "autograder", "grade", str(path), "--assignment",
             CHAPTER, "--seed", "1"],
            cwd=REPO, check=True, capture_output=True,
        )  # fmt: skip

    start = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(grade, paths))
    return time.perf_counter() - start


PLAIN_CONFIG = """
import os
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = "benchmark"
c.Execute.timeout = 120
c.Execute.allow_errors = True
# the hidden-test cells import the grader and the reference from the repository
os.environ["PYTHONPATH"] = {repo!r}
"""


def plain_nbgrader(paths: list[Path]) -> float:
    with tempfile.TemporaryDirectory(prefix="plain-nbgrader-") as tmp:
        root = Path(tmp)
        (root / "nbgrader_config.py").write_text(
            PLAIN_CONFIG.format(root=str(root), repo=str(REPO))
        )
        shutil.copytree(COURSE_ROOT / "source" / CHAPTER, root / "source" / CHAPTER)
        nbgrader = [sys.executable, "-m", "nbgrader"]
        subprocess.run(
            [*nbgrader, "generate_assignment", CHAPTER, "--force"],
            cwd=root, check=True, capture_output=True,
        )  # fmt: skip
        for i, path in enumerate(paths):
            folder = root / "submitted" / f"student{i:03d}" / CHAPTER
            folder.mkdir(parents=True)
            shutil.copy(path, folder / f"{CHAPTER}.ipynb")
        start = time.perf_counter()
        subprocess.run(
            [*nbgrader, "autograde", CHAPTER, "--create", "--force"],
            cwd=root, check=True, capture_output=True,
        )  # fmt: skip
        return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--skip-nbgrader", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grading-benchmark-") as tmp:
        paths = make_batch(Path(tmp), args.submissions)
        n = len(paths)
        rows = []
        seconds, scores = ours(paths, args.jobs)
        rows.append((f"ours: one warm sandbox, --jobs {args.jobs}", seconds))
        rows.append(
            (f"one process per submission, {args.jobs} at a time",
             one_process_each(paths, args.jobs))
        )  # fmt: skip
        if not args.skip_nbgrader:
            rows.append(
                ("plain nbgrader autograde (one process)", plain_nbgrader(paths))
            )
    print(f"{n} submissions of {CHAPTER}; scores (ours): {sorted(set(scores))}")
    print(f"{'way':50s} {'total s':>8s} {'s/submission':>13s} {'vs ours':>8s}")
    for name, total in rows:
        print(f"{name:50s} {total:8.1f} {total / n:13.2f} {total / rows[0][1]:7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

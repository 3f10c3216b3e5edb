"""A class on JupyterHub, graded two ways, measured in the same run.

    python benchmarks/hub_autograde.py [--class-size 60] [--formgrader-sample 5]

1. the course's parallel autograde, as the instructor runs it from their JupyterLab
   terminal: ``python -m autograder autograde 03_self_attention --jobs 2``, the whole
   class in one command;
2. formgrader's button, one student per click: nbgrader's API ``autograde(assignment,
   student)``, which the button calls, one submission after another in one process (the
   instructor's server, which is busy for each), with the config formgrader loads.

The class is ``benchmarks/class_autograde.py``'s (filled in, unscaled, untouched, broken,
one slow). Way 2 is timed on the first ``--formgrader-sample`` submissions (by default
every kind once, the slow one not) and reported per submission, and for the class at
that rate; give it the class size to time it on the whole class. Neither counts
the browser: a click adds the round trip to the server and the dialog's rendering.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from class_autograde import CHAPTER, course, make_class, nbgrader, recorded, run  # noqa: E402

from tests.hub import formgrader_autograde  # noqa: E402


def generated(root: Path) -> Path:
    """The course root with the assignment generated, as formgrader's instructor has it
    before releasing (not timed, in either way)."""
    nbgrader(root, "generate_assignment", CHAPTER, "--force")
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--class-size", type=int, default=60)
    parser.add_argument("--formgrader-sample", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hub-benchmark-") as tmp:
        base = Path(tmp)
        (base / "class").mkdir()
        everyone = make_class(base / "class", args.class_size)
        root = generated(course(base, "whole-class", everyone))
        whole, _, _ = run(
            REPO, "-m", "autograder", "autograde", CHAPTER, "--jobs", str(args.jobs),
            "--course-dir", str(root),
        )  # fmt: skip
        graded = len(recorded(root))
        sample = list(everyone)[: args.formgrader_sample]
        root = generated(course(base, "formgrader", {s: everyone[s] for s in sample}))
        start = time.perf_counter()
        per = formgrader_autograde(root, CHAPTER, sample)
        clicks = time.perf_counter() - start
    n = args.class_size
    print(f"{n} submissions of {CHAPTER}, {os.cpu_count()} cores")
    print(
        f"  python -m autograder autograde --jobs {args.jobs}: {whole:.1f} s in all "
        f"({whole / n:.2f} s per submission), {graded} recorded, one command"
    )
    each = [r["seconds"] for r in per.values()]
    mean = sum(each) / len(each)
    print(
        f"  formgrader's button, {len(each)} submissions one click each: {sum(each):.1f} s "
        f"({mean:.2f} s per submission, {min(each):.1f} to {max(each):.1f} s; "
        f"{clicks:.1f} s with the process's start), so about {mean * n:.0f} s and "
        f"{n} clicks for {n}"
    )
    print(f"  ratio: {mean * n / whole:.1f}x")
    failed = ", ".join(s for s, r in per.items() if not r["success"])
    if failed:
        print(f"  (nbgrader reported a failure for {failed}: broken notebooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

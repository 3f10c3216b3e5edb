"""How far each hidden test's float32 reference lies from the exact answer, against the
test's tolerance: the figures behind the truth rule (``tolerances.TRUTH_RULE``).

    python benchmarks/reference_truth.py [--seeds 3] [--chapter 10_language_model]

For every case of every chapter (the cases the grader draws for each seed), prints the
largest |reference in float32 - reference in float64| as a share of the case's tolerance,
and how the case is judged: ``reference`` (the share is at most TRUTH_SHARE: the float32
reference is the yardstick), ``truth`` (judged against the float64 answer), ``rule``
(chapter 11's kernels: FlashAttention's rule, always against float64) or ``UNCOVERED``
(the float64 run failed or changed what the reference returns). Exits 1 when a case is
uncovered; ``tests/test_reference_truth.py`` runs it in CI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from autograder.grading.judging import prepare as preparing  # noqa: E402
from autograder.grading.judging.spec import load_chapter_tests  # noqa: E402
from autograder.grading.judging.tolerances import TRUTH_SHARE  # noqa: E402
from autograder.paths import chapter_ids  # noqa: E402


def rows(chapter: str, seeds: int):
    """(test id, case label, largest share over the seeds, how judged, why uncovered)."""
    tests = load_chapter_tests(chapter)
    found: dict[tuple[str, int], list] = {}
    for seed in range(seeds):
        for p in preparing.prepare(tests, tests.tests, seed):
            for i, c in enumerate(p.cases):
                row = found.setdefault((p.test.id, i), [c.label, 0.0, "reference", ""])
                if p.exact is not None:
                    row[2] = "rule"
                    continue
                report = p.truth_report[i]
                row[1] = max(row[1], report["share"])
                if report["uncovered"]:
                    row[2], row[3] = "UNCOVERED", report["uncovered"]
                elif report["by_truth"] and row[2] != "UNCOVERED":
                    row[2] = "truth"
    for (test_id, i), (label, share, how, why) in found.items():
        yield test_id, label or f"case {i + 1}", share, how, why


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--chapter", action="append", help="default: every chapter")
    args = parser.parse_args()
    uncovered = 0
    print(
        f"share: |float32 reference - float64| / tolerance, largest over {args.seeds} seeds"
    )
    print(f"judged against the float64 answer where the share exceeds {TRUTH_SHARE:g}")
    for chapter in args.chapter or chapter_ids():
        print(f"\n{chapter}")
        for test_id, label, share, how, why in rows(chapter, args.seeds):
            uncovered += how == "UNCOVERED"
            shown = f"{share:10.3g}" if how != "rule" else f"{'-':>10}"
            print(
                f"  {test_id:<28} {label[:44]:<44} {shown} {how}{' ' + why if why else ''}"
            )
    print(f"\n{uncovered} case(s) uncovered")
    return 1 if uncovered else 0


if __name__ == "__main__":
    sys.exit(main())

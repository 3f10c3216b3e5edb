"""How much of FlashAttention's rule honest kernels use: the figures behind chapter 11's
hidden-test budgets (``autograder/grading/judging/tolerances.py``, ``FLASH_RULE*``).

    python benchmarks/kernel_tolerance.py [--seeds 30]

For each seed, the hidden tests of chapter 11 draw their cases as the grader does; the
reference kernels and the kernels written independently from the chapter's text
(``tests/test_kernels.py``: other tiles, base-2 exponentials) run on them. Printed, per
output: the largest error as a multiple of PyTorch's own float32 error, and the largest
share of the grader's budget used (1.0 = on the edge). Runs in Triton's interpreter.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from autograder.grading.judging import prepare as preparing  # noqa: E402
from autograder.grading.judging.spec import load_chapter_tests  # noqa: E402
from autograder.grading.sealed import probe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    seeds = parser.parse_args().seeds
    import test_kernels  # the independent kernels

    tests = load_chapter_tests("11_kernels")
    reference = vars(tests.reference())
    kernels = {
        "reference": reference,
        "independent": {**reference, **test_kernels.INDEPENDENT},
    }
    multiple, share = defaultdict(float), defaultdict(float)
    for seed in range(seeds):
        for p in preparing.prepare(tests, tests.tests, seed):
            for who, namespace in kernels.items():
                got = probe.run_test(namespace, p.plain_plan())
                for c, g, exact, allowed in zip(
                    p.cases, got, p.exact, p.allowed, strict=True
                ):
                    pairs = zip(
                        p.test.outputs,
                        preparing._tensors(g["value"]),
                        preparing._tensors(exact["value"]),
                        allowed,
                        strict=True,
                    )
                    for j, (name, mine, truth, budget) in enumerate(pairs):
                        rule = preparing._rule(p.test, c, j)
                        float32 = (budget - rule.floor) / rule.factor
                        error = preparing._largest_error(mine, truth)
                        key = (who, name)
                        multiple[key] = max(multiple[key], error / max(float32, 1e-30))
                        share[key] = max(share[key], error / budget)
    print(
        f"{seeds} seeds x {len(tests.tests)} tests of chapter 11, Triton's interpreter"
    )
    print(
        f"{'kernels':<12} {'output':<6} {'x PyTorch f32 error':>20} {'budget used':>12}"
    )
    for (who, name), m in sorted(multiple.items()):
        print(f"{who:<12} {name:<6} {m:>20.2f} {share[who, name]:>12.2f}")


if __name__ == "__main__":
    main()

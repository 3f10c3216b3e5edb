"""Hidden-test cells for plain ``nbgrader autograde``: run one hidden test in the kernel.

The nbgrader source notebooks call :func:`run_hidden_test` from their hidden test cells, so
that ``nbgrader autograde`` gives meaningful grades. In that mode student code and the
check share one process, as always with nbgrader; ``python -m autograder grade`` instead
keeps the verdict out of the student's process.
"""

import secrets

from autograder.judge import judge
from autograder.prepare import prepare
from autograder.probe import run
from autograder.spec import load_chapter_tests


def run_hidden_test(
    chapter: str, test_id: str, namespace: dict, seed: int | None = None
) -> None:
    tests = load_chapter_tests(chapter)
    test = tests.test(test_id)
    seed = secrets.randbits(32) if seed is None else seed
    (p,) = prepare(tests, [test], seed)
    got = run(namespace, [p.probe_plan])[0]
    verdict = judge(tests, test, p.cases, p.plans, p.expected, got)
    if not verdict.passed:
        raise AssertionError(verdict.message)
    print(f"✓ {test_id}: {verdict.message}")

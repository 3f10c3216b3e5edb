"""Tests of the tests, shared by every chapter's test module: answers written independently
of the reference (another style, another dtype, another order of operations) that the
hidden tests must pass when right and fail when wrong.

A chapter's module lists them in two tables and hands them to the helpers here::

    @pytest.mark.parametrize("exercise, wrong, test_ids", wrong_answers(WRONG))
    def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
        assert_wrong_answer_fails(CHAPTER, reference, exercise, wrong, test_ids)
"""

from __future__ import annotations

from types import ModuleType

import pytest

from autograder.grading import probe
from autograder.grading.judge import judge
from autograder.grading.prepare import prepare
from autograder.grading.spec import load_chapter_tests

SEEDS = [0, 1, 2]


def verdicts(tests, namespace, seed=0, selected=None):
    """Judge what ``namespace`` (exercise name -> implementation) returns on every hidden test."""
    out = {}
    for p in prepare(tests, selected or tests.tests, seed):
        got = probe.run(namespace, [p.probe_plan])[0]
        out[p.test.id] = judge(tests, p.test, p.cases, p.plans, p.expected, got)
    return out


def _name(answer) -> str:
    return getattr(answer, "__name__", repr(answer))


def wrong_answers(table: dict) -> list:
    """``{exercise: {wrong: [test ids it must fail]}}`` (or ``{exercise: [wrong, ...]}``:
    it must fail every test of its exercise) as pytest parameters."""
    params = []
    for exercise, answers in table.items():
        pairs = (
            answers.items()
            if isinstance(answers, dict)
            else ((w, None) for w in answers)
        )
        for wrong, test_ids in pairs:
            params.append(pytest.param(exercise, wrong, test_ids, id=_name(wrong)))
    return params


def right_answers(table: dict) -> list:
    """``{exercise: [right, ...]}`` as pytest parameters."""
    return [
        pytest.param(exercise, right, id=f"{exercise}-{_name(right)}")
        for exercise, answers in table.items()
        for right in answers
    ]


def assert_wrong_answer_fails(
    chapter: str,
    reference: ModuleType,
    exercise: str,
    wrong,
    test_ids: list[str] | None,
) -> None:
    """``wrong`` in place of the reference's ``exercise`` fails each of ``test_ids`` (every
    test of the exercise when None)."""
    tests = load_chapter_tests(chapter)
    selected = (
        [t for t in tests.tests if t.exercise == exercise]
        if test_ids is None
        else [tests.test(i) for i in test_ids]
    )
    results = verdicts(tests, {**vars(reference), exercise: wrong}, 0, selected)
    for test_id, v in results.items():
        assert not v.passed, f"{_name(wrong)} passes {test_id}"


def assert_right_answer_passes(
    chapter: str, reference: ModuleType, exercise: str, right, seed: int
) -> None:
    """``right`` in place of the reference's ``exercise`` passes every test of the exercise."""
    tests = load_chapter_tests(chapter)
    selected = [t for t in tests.tests if t.exercise == exercise]
    results = verdicts(tests, {**vars(reference), exercise: right}, seed, selected)
    for test_id, v in results.items():
        assert v.passed, f"{_name(right)} fails {test_id}: {v.message}"

"""Tests of the tests: every hidden test passes the reference and fails the stub and
plausible wrong answers, and the feedback names the known mistakes."""

import pytest

from autograder.grading.judging.spec import load_chapter_tests
from tests.answers import (
    SEEDS,
    verdicts,
)
from tests.notebooks import CHAPTERS


@pytest.mark.parametrize("seed", SEEDS)
def test_reference_passes_every_hidden_test(chapter, seed):
    tests = load_chapter_tests(chapter)
    results = verdicts(tests, vars(tests.reference()), seed)
    assert all(v.passed for v in results.values()), {
        k: v.message for k, v in results.items() if not v.passed
    }


def _stub(*args, **kwargs):
    raise NotImplementedError


_stub.apply = _stub  # an autograd Function's stub: its apply raises too


def test_stub_fails_every_hidden_test(chapter):
    tests = load_chapter_tests(chapter)
    results = verdicts(tests, {name: _stub for name in tests.exercises})
    for test_id, v in results.items():
        assert not v.passed, test_id
        assert "not implemented yet" in v.message


def test_missing_function_fails_with_a_clear_message(chapter):
    tests = load_chapter_tests(chapter)
    for v in verdicts(tests, {}).values():
        assert not v.passed and "does not define" in v.message


@pytest.mark.parametrize("chapter_id", CHAPTERS)
def test_every_hidden_test_fails_at_least_three_known_mistakes(chapter_id):
    tests = load_chapter_tests(chapter_id)
    failed_by = {t.id: [] for t in tests.tests}
    for mistake in tests.mistakes:
        selected = [t for t in tests.tests if t.exercise == mistake.exercise]
        namespace = {**vars(tests.reference()), mistake.exercise: mistake.impl}
        for seed in SEEDS:
            for test_id, v in verdicts(tests, namespace, seed, selected).items():
                if not v.passed:
                    failed_by[test_id].append(mistake.name)
    for test_id, names in failed_by.items():
        assert len(set(names)) >= 3, f"{test_id} fails only on {set(names)}"


@pytest.mark.parametrize("chapter_id", CHAPTERS)
def test_every_known_mistake_is_caught_and_named(chapter_id):
    tests = load_chapter_tests(chapter_id)
    for mistake in tests.mistakes:
        selected = [t for t in tests.tests if t.exercise == mistake.exercise]
        namespace = {**vars(tests.reference()), mistake.exercise: mistake.impl}
        results = verdicts(tests, namespace, 0, selected)
        failing = [v for v in results.values() if not v.passed]
        assert failing, f"no hidden test catches {mistake.exercise}: {mistake.name}"
        assert any(mistake.hint in v.message for v in failing), (
            mistake.name,
            [v.message for v in failing],
        )


def test_test_ids_are_unique_across_the_course():
    ids = [t.id for c in CHAPTERS for t in load_chapter_tests(c).tests]
    assert len(ids) == len(set(ids))

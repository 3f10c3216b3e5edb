"""Tests of the tests, shared by every chapter's test module: answers written independently
of the reference (another style, another dtype, another order of operations) that the
hidden tests must pass when right and fail when wrong.

A chapter's module lists them in two tables and hands them to the helpers here::

    @pytest.mark.parametrize("exercise, wrong, test_ids", wrong_answers(WRONG))
    def test_independent_wrong_answers_fail(exercise, wrong, test_ids):
        assert_wrong_answer_fails(CHAPTER, reference, exercise, wrong, test_ids)
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from autograder.grading.judging import delegation
from autograder.grading.judging.judge import verdict
from autograder.grading.judging.prepare import prepare
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.running.student_code import StudentCode, given_sources
from autograder.grading.sealed import probe
from autograder.paths import REPO

SEEDS = [0, 1, 2]


def verdicts(tests, namespace, seed=0, selected=None):
    """Judge what ``namespace`` (exercise name -> implementation) returns on every hidden
    test, exactly as the grader judges a notebook: the same verdict function, reading the
    code a notebook holding these implementations would hold (``code_of``)."""
    code = code_of(namespace, tests.chapter)
    out = {}
    for p in prepare(tests, selected or tests.tests, seed):
        got = probe.run_test(namespace, _as_called(p, namespace))
        out[p.test.id] = verdict(tests, p, got, code)
    return out


def _as_called(p, namespace):
    """The plan a notebook would run; but a kernel exercise answered by a function of the
    launcher's arguments (a known mistake, a stub) is called directly, as the grader calls
    a known mistake: these tests judge its numbers (a notebook's non-kernel gets no point,
    ``test_kernels``)."""
    target = namespace.get(p.test.exercise)
    launched = any(c.get("launch") for c in p.calls)
    if launched and target is not None and not probe.is_triton_kernel(target):
        return p.direct_plan()
    return p.test_plan


def code_of(namespace: dict, chapter: str) -> StudentCode:
    """The code cells of a notebook that defines ``namespace``: each function's or class's
    source under its name in the namespace, with the top-level definitions and imports of
    its module that it reads. What has no source (a builtin, a partial) adds nothing."""
    cells, done = [], set()
    for name, value in namespace.items():
        written = _written_out(value, done)
        if written is None:
            continue
        cells += written
        if value.__name__ != name:
            cells.append(f"{name} = {value.__name__}")
    return StudentCode(cells, given_sources(chapter))


def _written_out(value, done: set) -> list[str] | None:
    """``value``'s definition as a notebook would hold it, after the statements of its
    module that it reads; [] when ``done`` already holds it, None when it has no source
    here. A definition is keyed by (module, name), however it was reached."""
    source = _source(value)
    if source is None:
        return None
    key = (value.__module__, value.__qualname__)
    if key in done:
        return []
    done.add(key)
    module = sys.modules.get(value.__module__)
    return [*_module_context(module, ast.parse(source), done), source]


def _source(value) -> str | None:
    """The definition of a function or class written in this repository, dedented; None
    for anything else (PyTorch's own, a lambda, a partial)."""
    if not (inspect.isfunction(value) or inspect.isclass(value)):
        return None
    if not value.__name__.isidentifier():  # a lambda
        return None
    return _definition(value)


@functools.cache
def _definition(value) -> str | None:
    try:
        if not Path(inspect.getsourcefile(value)).resolve().is_relative_to(REPO):
            return None
        source = textwrap.dedent(inspect.getsource(value))
        ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    return source


@functools.cache
def _top_level(module: ModuleType) -> dict[str, list[ast.AST]]:
    """A module's top-level statements by the names they bind (as the grader reads them)."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return {}
    return delegation._top_level_bindings([tree])


def _module_context(module, tree: ast.AST, done: set) -> list[str]:
    """The top-level statements of ``module`` that the code in ``tree`` reads, following
    what they read in turn (each statement once)."""
    if module is None:
        return []
    bound = _top_level(module)
    cells, todo = [], [tree]
    while todo:
        for sub in ast.walk(todo.pop()):
            if not isinstance(sub, ast.Name):
                continue
            for node in bound.get(sub.id, []):
                named = isinstance(node, ast.FunctionDef | ast.ClassDef)
                key = (module.__name__, node.name if named else id(node))
                if key not in done:
                    done.add(key)
                    cells += _statement(node, done)
                    todo.append(node)
    return cells


def _statement(node: ast.AST, done: set) -> list[str]:
    """A top-level statement as a notebook would hold it: a function or class imported
    from this repository is written out, as the student would have written it."""
    if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
        return [ast.unparse(node)]
    module = importlib.import_module(node.module)
    kept, cells = [], []
    for alias in node.names:
        value = getattr(module, alias.name, None)
        written = _written_out(value, done)
        if written is None:
            kept.append(alias)
            continue
        cells += written
        if alias.asname and alias.asname != value.__name__:
            cells.append(f"{alias.asname} = {value.__name__}")
    if kept:
        cells.insert(0, ast.unparse(ast.ImportFrom(node.module, kept, 0)))
    return cells


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
    namespace = {**vars(reference), exercise: wrong}
    results = verdicts(tests, namespace, 0, selected)
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

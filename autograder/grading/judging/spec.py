"""The vocabulary of hidden tests: a test calls one exercise on cases drawn at grading time.

A chapter's hidden tests and known mistakes live in two modules named like its solutions:

- ``autograder/hidden_tests/<module>.py``, ``TESTS``: :class:`HiddenTest` objects. Each
  makes its cases from a seeded ``torch.Generator``; the student's outputs on those cases
  are compared with the reference's (``solutions/<module>.py``) at the test's tolerance.
- ``autograder/known_mistakes/<module>.py``, ``MISTAKES``: :class:`Mistake` objects,
  plausible wrong answers. When a student's output matches one, the feedback names it; the
  project's own tests check that every hidden test fails on them (tests of the tests).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from autograder.grading.judging.delegation import FEATURES
from autograder.grading.judging.tolerances import LEVELS
from autograder.grading.sealed.probe import CallPlan
from autograder.paths import chapter_ids, module_name


@dataclass
class Init:
    """Constructor arguments for a module exercise: the student's class is built with these
    and then loaded with the reference's (randomised) parameters."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    # False: keep the module's own parameters (a module with fixed buffers only, say)
    load_state: bool = True


@dataclass
class Case:
    """One call of an exercise. ``label`` is shown in feedback; the inputs never are."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    init: Init | None = None  # set for module exercises (a class, then called)
    method: str | None = None  # call this method instead of forward
    # methods called on the module before the call, e.g.
    # [("load_torch_weights", (torch_layer("MultiheadAttention", ...),))]
    setup: list[tuple[str, tuple]] = field(default_factory=list)
    # the exception the docstring promises for these arguments (a class name, such as
    # "ValueError"): the reference raises it, and so must the student's code
    raises: str | None = None
    # the upstream gradient dL/d(output): the call also returns the gradients of the
    # positional tensor arguments, computed by the exercise's backward (probe.CallPlan)
    upstream_grad: Any = None
    # with upstream_grad: the outcome ends with what the output's autograd Function saved
    # for its backward (probe.CallPlan)
    saved: bool = False
    # a kernel exercise: which of the course's launchers starts it (``probe.LAUNCHERS``);
    # the arguments are the launcher's, after the kernel
    launch: str | None = None

    def to_plan(self, state: dict | None) -> CallPlan:
        """The plain data a probe needs to make this call (tensors, numbers, strings)."""
        init = (
            None
            if self.init is None
            else [list(self.init.args), dict(self.init.kwargs)]
        )
        return {
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "init": init,
            "state": state,
            "method": self.method,
            "setup": [[name, list(args)] for name, args in self.setup],
            "upstream_grad": self.upstream_grad,
            "saved": self.saved,
            "launch": self.launch,
        }


def case(
    *args: Any,
    label: str = "",
    init: Init | None = None,
    method: str | None = None,
    setup: list[tuple[str, tuple]] | None = None,
    raises: str | None = None,
    upstream_grad: Any = None,
    saved: bool = False,
    launch: str | None = None,
    **kwargs: Any,
) -> Case:
    """Shorthand: ``case(q, k, v, mask=m, label="causal mask")``; ``raises="ValueError"``
    for arguments the exercise's docstring says it refuses; ``upstream_grad=g`` to grade
    the gradients too (the outcome is [output, then each positional tensor's gradient],
    then with ``saved=True`` the tensors its autograd Function saved for the backward);
    ``launch="forward"`` to launch a kernel exercise with the course's launcher."""
    return Case(
        args=args,
        kwargs=kwargs,
        label=label,
        init=init,
        method=method,
        setup=list(setup or []),
        raises=raises,
        upstream_grad=upstream_grad,
        saved=saved,
        launch=launch,
    )


def torch_layer(
    name: str, *args: Any, state: dict | None = None, **kwargs: Any
) -> dict:
    """A PyTorch layer as plain data, built inside the sandbox for a call argument:
    ``torch_layer("MultiheadAttention", 8, 2, batch_first=True, state=mha.state_dict())``.
    ``name`` must be one of ``autograder.grading.sealed.probe._TORCH_LAYERS``."""
    return {
        "torch.nn": name,
        "args": list(args),
        "kwargs": dict(kwargs),
        "state": state,
    }


def notebook_function(name: str, **kwargs: Any) -> dict:
    """One of the notebook's own functions as a call argument, with ``kwargs`` bound:
    ``attend(q, k, v, score_fn=notebook_function("general_score", W=W))`` calls the
    student's ``attend`` with the student's ``general_score`` (and the reference's with the
    reference's). Plans stay plain data: the function is looked up where the call is made."""
    return {"notebook": name, "kwargs": dict(kwargs)}


def notebook_module(
    name: str, *args: Any, state: dict | None = None, **kwargs: Any
) -> dict:
    """A module of one of the notebook's own classes as a call argument, built with these
    arguments and loaded with ``state``: ``generate(notebook_module("TransformerLM", 50,
    ..., state=weights), prompt, 4)`` calls the student's ``generate`` with a model of the
    student's ``TransformerLM`` (and the reference's with the reference's)."""
    return {
        "notebook": name,
        "init": [list(args), dict(kwargs)],
        "state": state,
    }


def seeded_generator(seed: int) -> dict:
    """A ``torch.Generator`` seeded with ``seed``, as a call argument: the student's call
    and the reference's draw the same random numbers."""
    return {"torch.Generator": int(seed)}


@dataclass
class HiddenTest:
    id: str  # unique across the course; also the nbgrader grade_id
    exercise: str  # the function or class name the student implements
    points: float
    description: str  # what passing means, shown to students with the test's name
    make_cases: Callable[[Any], list[Case]]  # torch.Generator -> cases
    level: str = "op"  # a key of autograder.grading.judging.tolerances.LEVELS
    outputs: tuple[str, ...] = ()  # names of the returned values, for messages
    # PyTorch features the exercise reimplements: keys of
    # autograder.grading.judging.delegation.FEATURES. Attention ("sdpa", "mha",
    # "transformer_layer") is switched off while the test runs (grading/sealed/guard); any
    # other is a remark in the feedback, never a point.
    forbidden: tuple[str, ...] = ()
    # For a module exercise whose answer is a discrete choice (an argmax): True when the
    # reference, loaded with a case's drawn weights, decides every choice by a margin that
    # round-off cannot flip. Weights that fail are drawn again, so a correct answer never
    # loses a point to a near-tie (prepare.prepare).
    decisive: Callable[[Any, Case], bool] | None = None
    # FlashAttention's rule instead of ``level`` for the verdict: a plain PyTorch
    # computation of the exercise's math, called as the exercise is. The grader runs it in
    # float64 (the truth) and in float32 on each case; the student's outputs may differ
    # from the float64 ones by ``tolerances.FLASH_RULE`` of the float32 ones' error.
    # ``level`` still decides which known mistake the outputs match. For a kernel
    # exercise (cases with ``launch``), it takes the launcher's arguments, after the kernel.
    yardstick: Any = None

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"{self.id}: unknown tolerance level {self.level!r}")
        unknown = set(self.forbidden) - set(FEATURES)
        if unknown:
            raise ValueError(f"{self.id}: unknown forbidden features {sorted(unknown)}")


@dataclass
class Mistake:
    """A plausible wrong answer: same signature as the exercise, recognisable output."""

    exercise: str
    name: str
    hint: str  # says what went wrong and what to check, in the student's terms
    impl: Callable
    # the section of the book that teaches the point missed, as "CHAPTER#ANCHOR" (the
    # chapter that teaches it, which a later chapter reusing the mistake may not be, and
    # its heading's id in the built book): the feedback links to it
    section: str = ""


@dataclass
class ChapterTests:
    chapter: str
    tests: list[HiddenTest]
    mistakes: list[Mistake]

    @property
    def max_score(self) -> float:
        return float(sum(t.points for t in self.tests))

    @property
    def exercises(self) -> list[str]:
        return list(dict.fromkeys(t.exercise for t in self.tests))

    def test(self, test_id: str) -> HiddenTest:
        for t in self.tests:
            if t.id == test_id:
                return t
        raise KeyError(f"{self.chapter} has no hidden test {test_id!r}")

    def mistakes_for(self, exercise: str) -> list[Mistake]:
        return [m for m in self.mistakes if m.exercise == exercise]

    def reference(self) -> ModuleType:
        # chapter 11's reference runs in Triton's interpreter (``autograder/__init__``)
        return importlib.import_module(f"solutions.{module_name(self.chapter)}")


def graded_chapters() -> list[str]:
    """The chapters that have hidden tests, i.e. the nbgrader assignments, in order."""
    return [
        c
        for c in chapter_ids()
        if importlib.util.find_spec(f"autograder.hidden_tests.{module_name(c)}")
    ]


def load_chapter_tests(chapter: str) -> ChapterTests:
    name = module_name(chapter)
    module = importlib.import_module(f"autograder.hidden_tests.{name}")
    mistakes = []
    if importlib.util.find_spec(f"autograder.known_mistakes.{name}"):
        mistakes = importlib.import_module(f"autograder.known_mistakes.{name}").MISTAKES
    tests = ChapterTests(chapter, list(module.TESTS), list(mistakes))
    ids = [t.id for t in tests.tests]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{chapter}: duplicate hidden test ids in {ids}")
    return tests

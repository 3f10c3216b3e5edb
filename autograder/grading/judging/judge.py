"""Verdicts: the student's raw outputs against the reference's, with feedback that teaches.

:func:`verdict` is the one place a verdict is made, by the grader and by the tests of the
tests alike: it applies every rule to one prepared test, the outcomes the student's code
returned and the student's code as text. Runs only in the grader's own process, on plain
data (see ``probe.py``); nothing here executes student code. Messages describe what
differs (type, shape, dtype, NaN, error size) and name a known mistake when the student's
outputs match one, but never show the hidden inputs or the expected values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from autograder.grading.judging import delegation, outcomes
from autograder.grading.judging.prepare import PreparedTest
from autograder.grading.judging.spec import ChapterTests, HiddenTest, Mistake
from autograder.grading.judging.tolerances import (
    FLASH_RULE,
    FLASH_RULE_GRADIENTS,
    LEVELS,
    Tolerance,
)
from autograder.grading.running.student_code import StudentCode
from autograder.grading.sealed import guard, probe
from autograder.grading.sealed.probe import Outcome
from autograder.paths import chapter_page, load_course_utils

course_utils = load_course_utils()  # the same comparison the visible checks use


MAX_MESSAGE = 2_000  # characters of a verdict's message, whatever the student sent


@dataclass
class Verdict:
    test_id: str
    points: float
    passed: bool
    message: str
    # for the instructor's class report (``autograder/report``), never shown to students
    # apart from the message: the known mistake's name, and "guard" when the attention
    # guard refused a call of PyTorch's attention
    mistake: str | None = None
    refused: str | None = None
    # passed only with the course's stand-ins for these earlier exercises (upstream.py),
    # and how it failed with the student's own
    stood_in: tuple[str, ...] = ()
    own_failure: str = ""
    # a remark on the student's code (``delegation.remarks``): shown on a line of its
    # own, never on the line of a lost point, and it takes nothing
    remark: str = ""

    def __post_init__(self):
        # the message reaches the gradebook, the autograded notebook and the feedback
        # page: none of them may grow with what the student's code returned
        if len(self.message) > MAX_MESSAGE:
            self.message = self.message[: MAX_MESSAGE - 3] + "..."
        if len(self.remark) > MAX_MESSAGE:
            self.remark = self.remark[: MAX_MESSAGE - 3] + "..."

    @property
    def score(self) -> float:
        return float(self.points) if self.passed else 0.0

    def as_json(self) -> dict:
        return {
            "id": self.test_id,
            "score": self.score,
            "max_score": float(self.points),
            "passed": self.passed,
            "message": self.message,
            "mistake": self.mistake,
            "refused": self.refused,
            **({"stood_in": list(self.stood_in)} if self.stood_in else {}),
            **({"remark": self.remark} if self.remark else {}),
        }


def describe_difference(expected, got, tol: Tolerance, name: str) -> str | None:
    """None when ``got`` matches ``expected``; otherwise one sentence on how it differs."""
    if isinstance(expected, torch.Tensor):
        try:
            return course_utils.difference(name, got, expected, tol.rtol, tol.atol)
        except Exception as exc:  # noqa: BLE001 (sparse, meta, subclassed tensors...)
            return f"{name}: could not be compared ({type(exc).__name__}); return a plain dense tensor"
    if isinstance(expected, list):
        if not isinstance(got, list):
            return (
                f"{name}: expected {len(expected)} values (a tuple), got {_kind(got)}"
            )
        if len(got) != len(expected):
            return f"{name}: expected {len(expected)} values, got {len(got)}"
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            problem = describe_difference(e, g, tol, f"{name}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return (
            None
            if type(got) is type(expected)
            and got == expected  # type first: a tensor's == is no bool
            else f"{name}: expected {expected!r}, got {_kind(got)}"
        )
    if isinstance(expected, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"{name}: expected a number, got {_kind(got)}"
        if math.isclose(got, expected, rel_tol=tol.rtol, abs_tol=tol.atol):
            return None
        return f"{name}: expected a different number (off by {abs(got - expected):.3g})"
    return f"{name}: cannot compare values of type {type(expected).__name__}"


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, list):
        return f"a sequence of {len(value)} values"
    if isinstance(value, dict) and "unsupported" in value:
        return f"an object of type {value['unsupported']}"[:120]
    return f"{type(value).__name__} {value!r}"[:80]


def _raised(outcome: dict) -> str | None:
    """The class name of the exception an outcome holds, or None."""
    return outcome["error"].split(":", 1)[0] if "error" in outcome else None


def _outcome_problem(
    test: HiddenTest,
    expected: dict,
    got: dict,
    tol: Tolerance,
    per_output: list[Tolerance] | None = None,
) -> str | None:
    if "error" in expected:  # the docstring's contract: these arguments are refused
        if _raised(got) == _raised(expected):
            return None
        did = f"raised {got['error']}" if "error" in got else "returned a result"
        return f"should raise {_raised(expected)} here, as its docstring says, but it {did}"
    if "error" in got:
        return f"raised {got['error']}"
    exp, val = expected["value"], got["value"]
    if test.outputs and isinstance(exp, list) and len(exp) == len(test.outputs):
        if isinstance(val, list) and len(val) == len(exp):
            tols = per_output or [tol] * len(exp)
            for name, e, g, t in zip(test.outputs, exp, val, tols, strict=True):
                problem = describe_difference(e, g, t, f"`{name}`")
                if problem:
                    return problem
            return None
        return f"expected a tuple ({', '.join(test.outputs)}), got {_kind(val)}"
    return describe_difference(
        exp, val, per_output[0] if per_output else tol, "the output"
    )


def _matches(expected: dict, got: dict, test: HiddenTest, tol: Tolerance) -> bool:
    """One outcome equals another: both values, and within the test's tolerance."""
    return (
        "error" not in expected and _outcome_problem(test, expected, got, tol) is None
    )


NO_RESULT_MARK = "no result:"  # every message of a test that got no result begins so
NO_RESULT = f"{NO_RESULT_MARK} the notebook did not reach this test"

FLASH_RULE_MESSAGE = (
    f" (FlashAttention's rule: the error against the exact answer, computed in float64, "
    f"may be at most {FLASH_RULE.factor:g} times the error PyTorch's plain float32 "
    f"attention makes on the same inputs, {FLASH_RULE_GRADIENTS.factor:g} times for "
    f"gradients, plus {FLASH_RULE.floor:g})"
)


TRUTH_RULE_MESSAGE = (
    " (this case is judged against the exact answer, computed in float64: the "
    "reference's own float32 answer is not close enough to it to be the yardstick here)"
)


def verdict(
    tests: ChapterTests,
    prepared: PreparedTest,
    got: list[Outcome] | str | None,
    code: StudentCode,
    missing_reason: str = NO_RESULT,
    second: list[Outcome] | str | None = None,
) -> Verdict:
    """The verdict on one hidden test: the outputs case by case. A call that PyTorch's
    attention guard refused (the test forbids it) fails the test with the guard's own
    message. The student's code as text never takes a point: it may only add a remark
    (``delegation.remarks``). ``got`` is untrusted (validated here); a string in its
    place says why the test's result could not be used.

    ``second``: the outcomes of the test's second run, with the course's stand-ins for
    the earlier exercises it uses (``upstream.py``). The test passes if either run
    passes, so a mistake in an earlier exercise never costs this one a point; when both
    fail, the second run's failure is this exercise's own and is the one explained."""
    test = prepared.test
    found = _judged(tests, prepared, got, missing_reason)
    if not found.passed and prepared.stand_ins and _usable(second):
        with_course = _judged(tests, prepared, second, missing_reason)
        if with_course.passed:
            found = Verdict(
                test.id,
                test.points,
                True,
                "",
                stood_in=tuple(prepared.upstream),
                own_failure=found.message,
            )
            found.message = _stood_in_message(found, test.description, "")
        else:
            with_course.message += (
                f" (With the course's {_named(prepared.upstream)} standing in for "
                f"yours, too: this mistake is `{test.exercise}`'s own.)"
            )
            found = with_course
    if code.remarks is not None:  # read in a process of its own (``reading``)
        remark = code.remarks.get((test.exercise, test.forbidden), "")
    else:
        with delegation.READING_CODE:
            remark = delegation.remarks(
                code.cells, test.exercise, test.forbidden, code.given
            )
    found.remark = remark
    found.__post_init__()
    return found


def passes_alone(tests: ChapterTests, prepared: PreparedTest, got) -> bool:
    """Whether the test passes on these outcomes of the student's own code (its first
    run): ``verdict`` then never looks at its second run. No mistake is sought."""
    return _judged(tests, prepared, got, NO_RESULT, explain=False).passed


def _judged(tests, prepared, got, missing_reason, explain: bool = True) -> Verdict:
    """One run's verdict, before any remark on the code; ``explain``: a failure's known
    mistake is sought."""
    test = prepared.test
    if got is not None and not isinstance(got, str):  # str: why the result was unusable
        got = outcomes.validated(got, len(prepared.cases))
    if got is None or isinstance(got, str):
        return Verdict(
            test.id, test.points, False, missing_reason if got is None else got
        )
    refused = _refused_by_guard(got) if prepared.guarded else None
    if refused:
        return Verdict(test.id, test.points, False, refused, refused=_route(refused))
    return _compare_outputs(tests, prepared, got, explain)


def _usable(second) -> bool:
    """A second run that says something: it ran, and no stand-in failed to serve (an
    argument it cannot send, a gradient it cannot carry): then the first run decides."""
    if second is None or isinstance(second, str) or not isinstance(second, list):
        return False
    return not any(
        isinstance(o, dict) and probe.CANNOT_STAND_IN in str(o.get("error", ""))
        for o in second
    )


def _named(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    return (
        quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
    )


def _stood_in_message(v: Verdict, description: str, where: str) -> str:
    return (
        f"passed with the course's {_named(list(v.stood_in))} standing in for yours: "
        f"{description}. With your own it fails, so the mistake is in an earlier "
        f"exercise and costs no point here.{where} What differs with your own: "
        f"{v.own_failure}"
    )


def attribute(verdicts: list[Verdict], prepared: list[PreparedTest]) -> None:
    """In a test passed only with the stand-ins, name the place to fix: the earlier
    exercises whose own tests here fail (not those that passed with stand-ins of their
    own), or else those graded in another chapter."""
    tested = {p.test.exercise for p in prepared}
    wrong = {
        p.test.exercise for v, p in zip(verdicts, prepared, strict=True) if not v.passed
    }
    for v, p in zip(verdicts, prepared, strict=True):
        if not v.stood_in:
            continue
        culprits = [n for n in v.stood_in if n in wrong]
        elsewhere = [n for n in v.stood_in if n not in tested]
        if culprits:
            their = "its" if len(culprits) == 1 else "their"
            where = (
                f" Fix {_named(culprits)} first: {their} own tests fail with your code."
            )
        elif elsewhere:
            where = (
                f" Check {_named(elsewhere)} against the feedback of the chapter that "
                "grades it."
            )
        else:
            where = (
                " Each of them passes its own tests here: look for what your "
                f"`{p.test.exercise}` expects of them beyond their docstrings."
            )
        v.message = _stood_in_message(v, p.test.description, where)
        v.__post_init__()


def _route(refusal: str) -> str:
    """For the class report: what was switched off (``PyTorch's attention (name)``)."""
    return refusal.split(")", 1)[0] + ") switched off"


def _refused_by_guard(got: list[Outcome]) -> str | None:
    """The guard's message, when a call of the test used PyTorch's attention."""
    for outcome in got:
        error = outcome.get("error") or ""
        start = error.find(guard.MARK)
        if start >= 0:
            name = error[start + len(guard.MARK) :].split(")", 1)[0][:80]
            return guard.refusal(name)
    return None


def _compare_outputs(
    tests: ChapterTests, prepared: PreparedTest, got: list[Outcome], explain: bool
) -> Verdict:
    """The outputs against the reference's, case by case: the first failure explained."""
    test, cases, expected = prepared.test, prepared.cases, prepared.expected
    tol = LEVELS[test.level]
    rule = ""
    if prepared.exact is not None:  # FlashAttention's rule: against float64
        expected, rule = prepared.exact, FLASH_RULE_MESSAGE
    for i, (c, e, g) in enumerate(zip(cases, expected, got, strict=True)):
        per_output, case_rule = None, rule
        if prepared.exact is not None:
            per_output = [Tolerance(0.0, a) for a in prepared.allowed[i]]
        elif prepared.truth and prepared.truth[i] is not None:
            e, per_output = prepared.truth[i], prepared.truth_tolerances[i]
            case_rule = TRUTH_RULE_MESSAGE
        problem = _outcome_problem(test, e, g, tol, per_output)
        if problem:
            if "max abs error" in problem:  # a difference of numbers: the rule applies
                problem += case_rule
            where = f"case {i + 1} of {len(cases)}" + (
                f" ({c.label})" if c.label else ""
            )
            message = f"`{test.exercise}` {where}: {problem}."
            mistake = _recognise_mistake(tests, prepared, got, tol) if explain else None
            hint = f" Likely mistake: {mistake.hint}" if mistake else ""
            if mistake and mistake.section:
                hint += f" Read again: {chapter_page(*mistake.section.split('#'))}"
            return Verdict(
                test.id,
                test.points,
                False,
                message + hint,
                mistake=mistake.name if mistake else None,
            )
    return Verdict(test.id, test.points, True, f"passed: {test.description}")


def _recognise_mistake(
    tests: ChapterTests, prepared: PreparedTest, got: list[Outcome], tol: Tolerance
) -> Mistake | None:
    """The known mistake whose outputs equal the student's wherever it differs from the reference."""
    test, expected = prepared.test, prepared.expected
    # the reference's namespace, for the notebook functions a plan passes as arguments
    reference = vars(tests.reference())
    for mistake in tests.mistakes_for(test.exercise):
        wrong = prepared.mistake_outcomes.get((mistake.name, mistake.impl))
        if wrong is None:  # the same for every notebook of the batch: run once
            wrong = probe.run_test(
                {**reference, test.exercise: mistake.impl}, prepared.direct_plan()
            )
            prepared.mistake_outcomes[(mistake.name, mistake.impl)] = wrong
        telling = [
            i
            for i, w in enumerate(wrong)
            if "error" not in w and not _matches(expected[i], w, test, tol)
        ]
        if telling and all(_matches(wrong[i], got[i], test, tol) for i in telling):
            return mistake
    return None

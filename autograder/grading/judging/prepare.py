"""Draw a test's inputs at grading time and compute what the reference returns on them."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import torch

from autograder.grading.judging import one_interpreter, upstream
from autograder.grading.judging.spec import Case, ChapterTests, HiddenTest
from autograder.grading.judging.tolerances import (
    FLASH_RULE,
    FLASH_RULE_GRADIENTS,
    ErrorBudget,
)
from autograder.grading.sealed import probe
from autograder.grading.sealed.guard import ATTENTION_FEATURES
from autograder.grading.sealed.probe import CallPlan, Outcome, TestPlan


class SharedCache(dict):
    """A cache that every copy of a prepared test shares: each notebook of a batch
    gets its own deep copy of the tests (``grade.Batch``), and what a known mistake
    outputs on the batch's inputs is the same for all of them."""

    def __deepcopy__(self, memo):
        return self


@dataclass
class PreparedTest:
    test: HiddenTest
    cases: list[Case]
    calls: list[CallPlan]  # plain data sent to the student's kernel: inputs only
    expected: list[Outcome]  # the reference's outcomes, kept in the grader
    # a test with a yardstick (FlashAttention's rule): per case, the float64 truth and
    # each output's largest allowed error against it
    exact: list[Outcome] | None = None
    allowed: list[list[float]] = field(default_factory=list)
    # the earlier exercises the second run replaces by the course's stand-ins
    # (``upstream.py``): {"functions": [...], "modules": [...]}, or None: no second run
    stand_ins: dict | None = None
    reference_module: str = ""  # what answers the stand-ins (``solutions.<module>``)
    # each known mistake's outcomes on these cases, by its name and function (``judge``)
    mistake_outcomes: SharedCache = field(default_factory=SharedCache)

    @property
    def test_plan(self) -> TestPlan:
        """What the student's kernel runs: the calls, and whether they run with
        PyTorch's attention switched off (the test forbids it)."""
        return {
            "exercise": self.test.exercise,
            "calls": self.calls,
            "guarded": self.guarded,
        }

    @property
    def guarded(self) -> bool:
        return bool(ATTENTION_FEATURES & set(self.test.forbidden))

    @property
    def second_plan(self) -> TestPlan:
        """The test again, with the earlier exercises it uses played by the course's
        stand-ins (``probe._run_with_stand_ins``)."""
        return {**self.test_plan, "oracle": self.stand_ins}

    @property
    def upstream(self) -> list[str]:
        """The names the second run replaces, in order."""
        if self.stand_ins is None:
            return []
        return sorted(self.stand_ins["functions"] + self.stand_ins["modules"])

    def direct_plan(self, exercise: str | None = None) -> TestPlan:
        """``plain_plan`` with every call made directly: a kernel exercise's yardstick
        and known mistakes are functions of the launcher's arguments (what the kernel
        computes), not kernels."""
        plan = self.plain_plan(exercise)
        return {**plan, "calls": [{**c, "launch": None} for c in plan["calls"]]}

    def plain_plan(self, exercise: str | None = None) -> TestPlan:
        """The same calls for the grader's own implementations (the reference, a known
        mistake), run in the grader as they are."""
        return {
            "exercise": exercise or self.test.exercise,
            "calls": self.calls,
            "guarded": False,
        }


_REDRAWS = 50  # draws of a case's weights before a test is called broken


def generator(seed: int, test_id: str) -> torch.Generator:
    """A generator per test, so adding a test never changes another test's inputs."""
    return torch.Generator().manual_seed(
        (seed * 1_000_003 + zlib.crc32(test_id.encode())) % 2**63
    )


def _randomised_state(
    module: torch.nn.Module, g: torch.Generator
) -> dict[str, torch.Tensor]:
    """Reference parameters drawn from ``g`` (not the module's own init), kept at unit scale."""
    with torch.no_grad():
        for p in module.parameters():
            scale = 1 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.5
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def prepare(
    tests: ChapterTests, selected: list[HiddenTest], seed: int
) -> list[PreparedTest]:
    reference = vars(tests.reference())
    prepared = []
    for test in selected:
        g = generator(seed, test.id)
        cases = test.make_cases(g)
        calls = []
        for c in cases:
            state = None
            if c.init is not None and c.init.load_state:
                module = reference[test.exercise](*c.init.args, **c.init.kwargs)
                state = _randomised_state(module, g)
                for _ in range(_REDRAWS):
                    if test.decisive is None or test.decisive(module, c):
                        break
                    state = _randomised_state(module, g)
                else:
                    raise RuntimeError(
                        f"{test.id}: no decisive weights in {_REDRAWS} draws"
                    )
            calls.append(c.to_plan(state))
        p = PreparedTest(test, cases, calls, [])
        with one_interpreter.LOCK:
            p.expected = probe.run_test(reference, p.plain_plan())
        for c, outcome in zip(cases, p.expected, strict=True):
            raised = outcome.get("error", "").split(":", 1)[0] or None
            if raised != c.raises:
                raise RuntimeError(
                    f"the reference fails hidden test {test.id} ({c.label}): "
                    f"{outcome.get('error') or 'it raised nothing'}"
                )
        if test.yardstick is not None:
            p.exact, p.allowed = _flash_rule(reference, p)
        p.stand_ins = upstream.stand_ins(reference, test.exercise, calls)
        p.reference_module = reference["__name__"]
        prepared.append(p)
    return prepared


def _flash_rule(
    reference: dict, p: PreparedTest
) -> tuple[list[Outcome], list[list[float]]]:
    """The yardstick's float64 outcomes, and what each output may differ from them: the
    rule's multiple of the yardstick's own float32 error. The reference must meet it."""
    namespace = {**reference, p.test.exercise: p.test.yardstick}
    in32 = probe.run_test(namespace, p.direct_plan())
    in64 = probe.run_test(namespace, probe.map_tensors(p.direct_plan(), _widened))
    allowed = []
    for c, low, exact, ref in zip(p.cases, in32, in64, p.expected, strict=True):
        if "error" in exact or "error" in low:
            raise RuntimeError(f"the yardstick of {p.test.id} fails ({c.label})")
        budgets = [
            _rule(p.test, c, j).allowed(_largest_error(a, b))
            for j, (a, b) in enumerate(
                zip(_tensors(low["value"]), _tensors(exact["value"]), strict=True)
            )
        ]
        errors = [
            _largest_error(a, b)
            for a, b in zip(
                _tensors(ref["value"]), _tensors(exact["value"]), strict=True
            )
        ]
        if any(e > b for e, b in zip(errors, budgets, strict=True)):
            raise RuntimeError(
                f"the reference fails hidden test {p.test.id} ({c.label}): errors "
                f"{errors} against float64, allowed {budgets}"
            )
        allowed.append(budgets)
    return in64, allowed


GRADIENTS = ("dq", "dk", "dv")  # outputs that are gradients, by their names


def _rule(test: HiddenTest, case: Case, output: int) -> ErrorBudget:
    """The budget of one output: gradients have their own (after the first output, a
    call with an upstream gradient returns gradients; a backward kernel returns them)."""
    named = test.outputs[output] if output < len(test.outputs) else ""
    gradient = (case.upstream_grad is not None and output) or named in GRADIENTS
    return FLASH_RULE_GRADIENTS if gradient else FLASH_RULE


def _tensors(value) -> list[torch.Tensor]:
    return list(value) if isinstance(value, list) else [value]


def _largest_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return (got.double() - exact.double()).abs().max().item() if got.numel() else 0.0


def _widened(tensor: torch.Tensor) -> torch.Tensor:
    """A floating-point tensor in float64 (a plan's others as they are)."""
    return tensor.double() if tensor.is_floating_point() else tensor

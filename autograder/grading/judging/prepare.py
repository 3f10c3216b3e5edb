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
    LEVELS,
    TRUTH_RULE,
    TRUTH_SHARE,
    ErrorBudget,
    Tolerance,
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
    # any other test: per case, the exact answer (the reference in float64) and each
    # output's tolerance against it, where the reference's float32 answer is not far
    # closer to it than the test's tolerance (``TRUTH_RULE``); None: judged against the
    # reference's float32 answer at the test's level
    truth: list[Outcome | None] = field(default_factory=list)
    truth_tolerances: list[list[Tolerance]] = field(default_factory=list)
    # per case, for ``benchmarks/reference_truth.py``: the float32 reference's distance
    # from the exact answer as a share of the tolerance, and why a case is not covered
    truth_report: list[dict] = field(default_factory=list)
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
        else:
            _truth_rule(reference, p)
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


def _truth_rule(reference: dict, p: PreparedTest) -> None:
    """Where the reference's float32 answer lies further from the exact answer (the
    reference run in float64) than ``TRUTH_SHARE`` of the test's tolerance, the case is
    judged against the exact answer instead, with ``TRUTH_RULE``'s multiple of that
    float32 error added to the tolerance: an answer more exact than the reference never
    loses a point, whatever the seed."""
    level = LEVELS[p.test.level]
    with one_interpreter.LOCK:
        token = probe.IN_FLOAT64.set(True)
        try:
            in64 = probe.run_test(
                reference, probe.map_tensors(p.plain_plan(), _widened)
            )
        finally:
            probe.IN_FLOAT64.reset(token)
    for c, ref, exact in zip(p.cases, p.expected, in64, strict=True):
        report = {"case": c.label, "share": 0.0, "uncovered": "", "by_truth": False}
        p.truth_report.append(report)
        p.truth.append(None)
        p.truth_tolerances.append([])
        if "error" in ref:
            continue  # a refusal: the same in any precision
        if "error" in exact:
            report["uncovered"] = f"the reference fails in float64: {exact['error']}"
            continue
        groups = _output_groups(p.test, ref["value"], exact["value"])
        if groups is None:
            report["uncovered"] = "float64 changes what the reference returns"
            continue
        shares = [_share(pairs, level) for pairs in groups]
        report["share"] = max(shares, default=0.0)
        if report["share"] <= TRUTH_SHARE:
            continue
        report["by_truth"] = True
        p.truth[-1] = exact
        p.truth_tolerances[-1] = [_widened_tolerance(level, pairs) for pairs in groups]


def _output_groups(test: HiddenTest, low, exact) -> list[list[tuple]] | None:
    """The float leaves of the two answers paired, grouped as the judge applies
    tolerances (one group per named output, else one); None where they differ in
    anything but float values (a shape, an index, a type)."""
    named = (
        bool(test.outputs) and isinstance(low, list) and len(low) == len(test.outputs)
    )
    parts = list(zip(low, exact, strict=False)) if named else [(low, exact)]
    groups = []
    for a, b in parts:
        pairs: list[tuple] = []
        if not _pair_leaves(a, b, pairs):
            return None
        groups.append(pairs)
    return groups


def _pair_leaves(a, b, pairs: list) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return False
        if a.is_floating_point() and b.is_floating_point():
            pairs.append((a.double(), b.double()))
            return True
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and isinstance(b, float):
        pairs.append(
            (torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
        )
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            _pair_leaves(x, y, pairs) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_pair_leaves(a[k], b[k], pairs) for k in a)
    return type(a) is type(b) and a == b


def _differences(low: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|low - exact| element-wise, 0 where both are the same infinity or both NaN."""
    same = (low == exact) | (low.isnan() & exact.isnan())
    return torch.where(same, torch.zeros_like(low), (low - exact).abs())


def _share(pairs: list[tuple], level: Tolerance) -> float:
    """The largest |float32 - exact| as a share of the tolerance at that element."""
    worst = 0.0
    for low, exact in pairs:
        if not low.numel():
            continue
        room = level.atol + level.rtol * exact.abs().nan_to_num(posinf=0.0)
        gap = _differences(low, exact)
        share = torch.where(gap > 0, gap / room, torch.zeros_like(gap))
        worst = max(worst, share.nan_to_num(nan=math.inf).max().item())
    return worst


def _widened_tolerance(level: Tolerance, pairs: list[tuple]) -> Tolerance:
    """The level's tolerance, its absolute part widened to TRUTH_RULE's multiple of the
    reference's largest float32 error on this output (not where that error is NaN or
    infinite: the level's tolerance alone, against the exact answer, then)."""
    error = max(
        (_differences(a, b).max().item() for a, b in pairs if a.numel()), default=0.0
    )
    if not math.isfinite(error):
        return level
    return Tolerance(level.rtol, max(level.atol, TRUTH_RULE.allowed(error)))


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

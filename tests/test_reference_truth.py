"""Numbers are judged against the truth: where the reference's float32 answer is not far
closer to the exact answer than a test's tolerance, the case is judged against the exact
answer (``prepare._truth_rule``). An answer more exact than the reference never loses a
point, and a notebook scores the same under every seed."""

import functools
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from autograder.grading.judging.spec import load_chapter_tests
from autograder.paths import REPO
from tests.answers import verdicts
from tests.notebooks import CHAPTERS, user_environment


def test_every_case_of_every_chapter_is_covered():
    """The script prints each case's distance from the truth against its tolerance and
    fails when a case's reference cannot be run in float64 or changes there."""
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/reference_truth.py"), "--seeds", "2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=user_environment(),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "0 case(s) uncovered" in run.stdout
    # the case the rule was made for is judged against the truth
    assert any(
        "lm_cross_entropy" in line and line.rstrip().endswith("truth")
        for line in run.stdout.splitlines()
    ), run.stdout


def _in_float64(function):
    """``function`` computed in float64 and rounded once to its inputs' dtype: an answer
    more exact than any float32 computation."""

    @functools.wraps(function)
    def exact(*args, **kwargs):
        dtypes = [a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point()]
        out = function(*_widened(args), **_widened(kwargs))
        back = dtypes[0] if dtypes else torch.float32

        def narrow(v):
            if torch.is_tensor(v) and v.is_floating_point():
                return v.to(back)
            if isinstance(v, (tuple, list)):
                return type(v)(narrow(x) for x in v)
            return v

        return narrow(out)

    return exact


def _widened(value):
    """Floating-point tensors in float64, also inside containers and the keywords of a
    function passed as an argument (``score_fn=partial(general_score, W=W)``)."""
    if torch.is_tensor(value):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_widened(v) for v in value)
    if isinstance(value, dict):
        return {k: _widened(v) for k, v in value.items()}
    if isinstance(value, functools.partial):
        return functools.partial(
            value.func, *_widened(value.args), **_widened(value.keywords)
        )
    return value


def _functions(tests):
    """The chapter's function exercises a float64 wrapper can stand for (not classes,
    autograd Functions, kernels or calls with gradients)."""
    reference = vars(tests.reference())
    names = set()
    for t in tests.tests:
        target = reference.get(t.exercise)
        if not callable(target) or isinstance(target, type) or t.yardstick is not None:
            continue
        cases = t.make_cases(torch.Generator().manual_seed(0))
        if any(c.init or c.upstream_grad is not None or c.launch for c in cases):
            continue
        names.add(t.exercise)
    return reference, sorted(names)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_an_answer_more_exact_than_the_reference_keeps_every_point(chapter):
    tests = load_chapter_tests(chapter)
    reference, names = _functions(tests)
    exact = {**reference, **{n: _in_float64(reference[n]) for n in names}}
    selected = [t for t in tests.tests if t.exercise in names]
    for seed in (0, 1, 2):
        for test_id, v in verdicts(tests, exact, seed, selected).items():
            assert v.passed, f"seed {seed}, {test_id}: {v.message}"


def _shift_first(logits, targets):
    """The textbook log-softmax: subtract the row's largest logit first."""
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    log_probs = shifted - shifted.exp().sum(dim=-1, keepdim=True).log()
    return -log_probs.gather(-1, targets.unsqueeze(-1)).mean()


def _pytorchs(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@pytest.mark.parametrize(
    "honest", [_shift_first, _in_float64(_shift_first), _pytorchs], ids=str
)
def test_honest_cross_entropies_score_the_same_under_every_seed(honest):
    """Chapter 10's "logits near -1e4": the reference's float32 loss is about 1e-4 from the
    exact one; answers within 2e-7 of it lost 2 points on most seeds before the rule."""
    tests = load_chapter_tests("10_language_model")
    namespace = {**vars(tests.reference()), "cross_entropy": honest}
    for seed in range(12):
        (v,) = verdicts(
            tests, namespace, seed, [tests.test("lm_cross_entropy")]
        ).values()
        assert v.passed, f"seed {seed}: {v.message}"

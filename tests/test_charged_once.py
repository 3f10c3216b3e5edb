"""One mistake, charged once, where it was made (``autograder/grading/judging/upstream.py``):
notebooks with a mistake in an earlier exercise (chapter 4's ``attention``, pasted into
chapter 6 too) lose that exercise's points only; a mistake in the later exercise itself
still costs it, and its feedback says the mistake is its own. Graded for real, in one batch.
"""

import subprocess
import sys

import nbformat
import pytest
import torch
from nbgrader.api import Gradebook

from autograder import paths
from autograder.grading.judging import upstream
from autograder.grading.judging.judge import passes_alone
from autograder.grading.judging.prepare import prepare
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.nbgrader_bridge import COURSE_ID
from autograder.grading.recording import verdict_record
from autograder.grading.running.execute import run_notebook
from autograder.grading.running.limits import Limits
from autograder.grading.running.sandbox import Sandbox
from autograder.grading.running.student_code import demo_sources
from autograder.grading.sealed import probe, result_reader
from autograder.grading.sealed.window import _answer
from autograder.report import data
from tests.notebooks import (
    QUICK_LIMITS,
    class_course,
    run_python,
    student_notebook,
    write,
)

UNSCALED = (" / math.sqrt(d_k)", "")
MHA = "MultiHeadAttention"
CH4, CH6 = "04_multi_head", "06_transformer"
# the mask's head dimension forgotten: MultiHeadAttention's own mistake
NO_HEAD_DIMENSION = ("mask = mask.unsqueeze(1)  #", "mask = mask  #")


def _planted(chapter, old, new):
    return lambda: student_notebook(chapter, lambda source: source.replace(old, new))


# ana's attention is unscaled, in chapter 4 and where chapter 6 asks for it again; ben's
# MultiHeadAttention forgets the mask's head dimension
CLASS = {
    CH4: {"ana": _planted(CH4, *UNSCALED), "ben": _planted(CH4, *NO_HEAD_DIMENSION)},
    CH6: {"ana": _planted(CH6, *UNSCALED)},
}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """Both assignments autograded for real into one gradebook, as a class is."""
    root = tmp_path_factory.mktemp("charged_once") / "course"
    class_course(root, CH4, CLASS[CH4])
    for student, make in CLASS[CH6].items():
        folder = root / "submitted" / student / CH6
        folder.mkdir(parents=True)
        write(make(), folder / f"{CH6}.ipynb")
    for chapter in (CH4, CH6):
        run = subprocess.run(
            [sys.executable, "-m", "autograder", "autograde", chapter, "--jobs", "2",
             "--course-dir", str(root), *QUICK_LIMITS],
            cwd=paths.REPO, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
    return root


def _verdicts(root, chapter, student):
    _, verdicts = verdict_record.read(root / "gradebook.db", chapter)
    return {v["test"]: v for v in verdicts if v["student"] == student}


def _exercise_of(chapter):
    return {t.id: t.exercise for t in load_chapter_tests(chapter).tests}


def _feedback(root, chapter, student):
    notebook = root / "autograded" / student / chapter / f"{chapter}.ipynb"
    return "".join(
        o.get("evalue", "") + o.get("text", "")
        for cell in nbformat.read(notebook, as_version=4).cells
        for o in cell.get("outputs", [])
    )


def test_an_earlier_mistake_costs_only_the_earlier_exercise(course):
    exercise = _exercise_of(CH4)
    tests = _verdicts(course, CH4, "ana")
    lost = {exercise[i] for i, v in tests.items() if v["score"] < v["max_score"]}
    assert lost == {"attention"}
    mha = [v for i, v in tests.items() if exercise[i] == MHA]
    assert mha and all("Fix `attention` first" in v["message"] for v in mha)
    assert all("values differ" in v["message"] for v in mha)  # what differs with yours
    # the feedback says so, and the report counts the mistake once, where it was made
    assert "standing in for yours" in _feedback(course, CH4, "ana")
    report = data.read_assignment(course / "gradebook.db", CH4)
    found = {(f.exercise, f.what): f.students for f in report.mistakes}
    assert found[("attention", "unscaled")] == ["ana"]
    assert {w for (e, _), who in found.items() if e == MHA for w in who} == {"ben"}
    assert report.lost_by("attention") == 1 and report.lost_by(MHA) == 1  # ben's own


def test_a_later_exercises_own_mistake_still_costs_it_and_is_named_its_own(course):
    exercise = _exercise_of(CH4)
    tests = _verdicts(course, CH4, "ben")
    lost = {exercise[i] for i, v in tests.items() if v["score"] < v["max_score"]}
    assert lost == {MHA}
    failed = [v for v in tests.values() if not v["passed"]]
    assert all(f"mistake is `{MHA}`'s own" in v["message"] for v in failed)


def test_across_chapters_chapter_6_charges_chapter_4s_mistake_nothing(course):
    tests = _verdicts(course, CH6, "ana")
    assert all(v["score"] == v["max_score"] for v in tests.values())
    # exercise 0's own test of attention (worth no points here) names the mistake
    assert not tests["ch6_mh_attention_heads"]["passed"]
    # load_torch_weights on the course's MultiHeadAttention ran in the grader too
    for layer in (
        "encoder_layer_torch_weights",
        "decoder_stack",
        "transformer_forward",
    ):
        assert "Fix `attention` first" in tests[layer]["message"], tests[layer]
    # the gradebook holds full marks for every point-bearing test of chapter 6
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", COURSE_ID) as gb:
        submission = gb.find_submission(CH6, "ana")
        assert submission.score == submission.max_score > 0


def test_which_earlier_exercises_stand_in_follows_the_references():
    tests = load_chapter_tests("06_transformer")
    reference = vars(tests.reference())
    layer = upstream.stand_ins(reference, "EncoderLayer", [])
    assert layer == {
        "functions": ["attention", "merge_heads", "split_heads"],
        "modules": [MHA, "PositionwiseFeedForward"],
        "largest": [1, 1],  # no calls here
    }
    # SublayerConnection takes a function, causal_mask a device: neither can stand in
    assert not upstream.takes_data(reference["SublayerConnection"].forward)
    assert not upstream.takes_data(reference["causal_mask"])
    assert upstream.stand_ins(reference, "PositionwiseFeedForward", []) is None


def _request(name, kind, **fields):
    return probe.encode_result([{"name": name, "kind": kind, **fields}])


def test_the_grader_answers_only_what_the_run_handed_over_allows():
    reference = vars(load_chapter_tests("04_multi_head").reference())
    server = upstream.ReferenceServer(reference)
    allowed = {"functions": ["attention"], "modules": [], "largest": [4, 24]}
    q = torch.randn(1, 2, 3, 4)
    ok = _answer(
        server, _request("attention", "call", args=[q, q, q], kwargs={}), allowed
    )
    assert torch.equal(ok["value"][0], reference["attention"](q, q, q)[0])
    for raw in (
        _request(MHA, "init", init=[[8, 2], {}]),  # not this run's
        _request("attention", "forward", args=[q], kwargs={}),  # not a module
        b"not a request",
        None,
    ):
        assert "value" not in _answer(server, raw, allowed)
    assert "value" not in _answer(
        server, _request("attention", "call", args=[q], kwargs={}), allowed
    )


def test_a_module_the_grader_would_build_too_large_is_refused_unbuilt():
    reference = vars(load_chapter_tests("04_multi_head").reference())
    allowed = {"functions": [], "modules": [MHA], "largest": [2**15, 64]}
    huge = _request(MHA, "init", init=[[2**15, 2], {}])  # 4 x 2^30 weights
    reply = _answer(upstream.ReferenceServer(reference), huge, allowed)
    assert "more than the grader builds" in reply["refused"]


def test_a_request_is_read_as_data():
    assert result_reader.decode_request(b"AGR1\xff\xff\xff\xff").startswith(
        "unreadable"
    )
    assert result_reader.decode_request(probe.encode_result([1, 2])).startswith(
        "unreadable"
    )


def test_without_triton_the_other_chapters_still_find_their_stand_ins():
    """Chapter 11's known mistakes import Triton, which macOS and Windows lack: which
    exercises stand in is read from the hidden tests alone."""
    code = (
        "import sys\n"
        "sys.modules['triton'] = None  # as on a machine without Triton\n"
        "from autograder.grading.judging.prepare import prepare\n"
        "from autograder.grading.judging.spec import load_chapter_tests\n"
        "tests = load_chapter_tests('03_self_attention')\n"
        "(p,) = prepare(tests, [tests.test('self_attention_module')], 0)\n"
        "print(p.upstream)\n"
    )
    run = run_python(code)
    assert run.stdout.strip() == "['scaled_dot_product_attention']", run.stderr[-2000:]


@pytest.mark.parametrize("who", ["right", "unscaled"])
def test_a_second_run_runs_only_when_the_students_own_code_fails(who):
    """The judge looks at a test's run with the stand-ins only when the run with the
    student's own code fails: a test that passed gets none (its result stays None),
    one that failed gets it."""
    tests = load_chapter_tests(CH4)
    prepared = prepare(tests, tests.tests, seed=1)
    twice = [i for i, p in enumerate(prepared) if p.stand_ins]
    nb = student_notebook(CH4) if who == "right" else _planted(CH4, *UNSCALED)()
    asked = []

    def passed(i, outcomes):
        asked.append(i)
        return passes_alone(tests, prepared[i], outcomes)

    with Sandbox() as sandbox, sandbox.kernel() as (km, workdir):
        got, run = run_notebook(
            nb, prepared, km, workdir, Limits(), demo_sources(CH4), passed
        )
    assert twice and sorted(asked) == twice
    own = {i: passes_alone(tests, prepared[i], got[i]) for i in twice}
    for i in twice:  # unscaled: MultiHeadAttention's tests pass with the stand-ins
        second = run.second_runs[i]
        assert second is None if own[i] else passes_alone(tests, prepared[i], second)
    assert all(own.values()) == (who == "right")


def test_a_module_answer_is_sized_before_it_is_computed():
    """Chapter 10's model with a vocabulary within every integer bound: its parameters fit,
    but its logits for the test's largest token count do not fit what the test's own
    tensors allow: refused, sized on the meta device, nothing computed."""
    reference = vars(load_chapter_tests("10_language_model").reference())
    server = upstream.ReferenceServer(reference)
    allowed = {"functions": [], "modules": ["TransformerLM"], "largest": [64, 1024]}
    init = [[8192, 256, 16, 1, 2, 32], {}]
    tokens = torch.zeros(1, 256, dtype=torch.long)
    reply = _answer(
        server,
        _request("TransformerLM", "forward", init=init, args=[tokens], kwargs={},
                 state=server(
                     {"name": "TransformerLM", "kind": "init", "init": init},
                     allowed["largest"],
                 )["parameters"], training=False),
        allowed,
    )  # fmt: skip
    assert "more than the grader computes" in reply["refused"], reply
    small = torch.zeros(1, 8, dtype=torch.long)
    init = [[40, 16, 16, 1, 2, 32], {}]
    state = server({"name": "TransformerLM", "kind": "init", "init": init}, [64, 1024])
    ok = _answer(
        server,
        _request("TransformerLM", "forward", init=init, args=[small], kwargs={},
                 state=state["parameters"], training=False),
        allowed,
    )  # fmt: skip
    assert ok["value"].shape == (1, 8, 40), ok


def test_an_answer_that_cannot_be_sized_is_not_computed():
    def unsized(x):
        return torch.zeros(int(x.sum().item()))  # data-dependent: no meta answer

    server = upstream.ReferenceServer({"unsized": unsized})
    with pytest.raises(upstream.TooLarge, match="cannot size"):
        server({"name": "unsized", "kind": "call", "args": [torch.ones(3)]}, [3, 3])

"""One mistake, charged once, where it was made (``autograder/grading/judging/upstream.py``):
notebooks with a mistake in an earlier exercise (chapter 4's ``attention``, pasted into
chapter 6 too) lose that exercise's points only; a mistake in the later exercise itself
still costs it, and its feedback says the mistake is its own. Graded for real, in one batch.
"""

import json
import subprocess
import sys

import pytest
import torch

from autograder import paths
from autograder.grading.judging import upstream
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.sealed import probe, result_reader
from autograder.grading.sealed.window import _answer
from tests.notebooks import QUICK_LIMITS, grade_cli, student_notebook, write

UNSCALED = (" / math.sqrt(d_k)", "")
MHA = "MultiHeadAttention"
# the mask's head dimension forgotten: MultiHeadAttention's own mistake
NO_HEAD_DIMENSION = ("mask = mask.unsqueeze(1)  #", "mask = mask  #")


def _planted(chapter, old, new):
    return lambda: student_notebook(chapter, lambda source: source.replace(old, new))


NOTEBOOKS = {
    "ch4_unscaled": ("04_multi_head", _planted("04_multi_head", *UNSCALED)),
    "ch4_mask": ("04_multi_head", _planted("04_multi_head", *NO_HEAD_DIMENSION)),
    "ch6_unscaled": ("06_transformer", _planted("06_transformer", *UNSCALED)),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("charged_once")
    paths = {}
    for name, (chapter, make) in NOTEBOOKS.items():
        nb = make()
        assert UNSCALED[0] not in str(nb) or name == "ch4_mask"
        (folder / name).mkdir()
        paths[name] = write(nb, folder / name / f"{chapter}.ipynb")
    run = grade_cli(*paths.values(), "--json", "--jobs", "2", *QUICK_LIMITS)
    results = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(results) == len(paths), run.stderr[-3000:]
    return {
        name: {t["id"]: t for t in r["tests"]}
        for name, r in zip(paths, results, strict=True)
    }


def _exercise_of(chapter):
    tests = load_chapter_tests(chapter)
    return {t.id: t.exercise for t in tests.tests}


def test_an_earlier_mistake_costs_only_the_earlier_exercise(graded):
    exercise = _exercise_of("04_multi_head")
    tests = graded["ch4_unscaled"]
    lost = {exercise[i] for i, t in tests.items() if t["score"] < t["max_score"]}
    assert lost == {"attention"}
    mha = [t for i, t in tests.items() if exercise[i] == MHA]
    assert mha and all(
        t["stood_in"] == ["attention", "merge_heads", "split_heads"] for t in mha
    )
    assert all("Fix `attention` first" in t["message"] for t in mha)
    assert all("values differ" in t["message"] for t in mha)  # what differs with yours


def test_a_later_exercises_own_mistake_still_costs_it_and_is_named_its_own(graded):
    exercise = _exercise_of("04_multi_head")
    tests = graded["ch4_mask"]
    lost = {exercise[i] for i, t in tests.items() if t["score"] < t["max_score"]}
    assert lost == {MHA}
    failed = [t for t in tests.values() if not t["passed"]]
    assert all(f"mistake is `{MHA}`'s own" in t["message"] for t in failed)
    assert not any(t.get("stood_in") for t in tests.values())


def test_across_chapters_chapter_6_charges_chapter_4s_mistake_nothing(graded):
    tests = graded["ch6_unscaled"]
    assert all(t["score"] == t["max_score"] for t in tests.values())
    # load_torch_weights on the course's MultiHeadAttention ran in the grader too
    assert MHA in tests["encoder_layer_torch_weights"]["stood_in"]
    # exercise 0's own test of attention (worth no points here) names the mistake
    assert not tests["ch6_mh_attention_heads"]["passed"]
    for layer in ("encoder_layer_values", "decoder_stack", "transformer_forward"):
        assert MHA in tests[layer]["stood_in"], tests[layer]
        assert "Fix `attention` first" in tests[layer]["message"], tests[layer]


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
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=paths.REPO, capture_output=True, text=True
    )
    assert run.stdout.strip() == "['scaled_dot_product_attention']", run.stderr[-2000:]

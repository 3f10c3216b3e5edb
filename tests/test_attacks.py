"""Attacks on the grader: each must earn nothing beyond the same answer without the trick.

Every attack is graded in one batch with the sandbox, as an instructor would. Attacks that
the sandbox alone stops (reading the reference from disk, say) are also graded once without
it, to prove the attack is real: there it does earn points.
"""

import hashlib
import json
import subprocess
import sys

import pytest

from autograder import paths
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.sealed import guard
from tests.attack_cells import PATCH_COMPARISONS, STEAL, stub_with_cell
from tests.notebooks import (
    grade_cli,
    release_notebook,
    scores_by_test,
    student_notebook,
    with_extra_cell,
    write,
)

pytestmark = pytest.mark.slow
CHAPTER = "03_self_attention"
REPO = str(paths.REPO)


def _unscaled(source: str) -> str:
    return source.replace(" / math.sqrt(d_k)", "")


def _unscaled_with_cell(source: str):
    return with_extra_cell(
        student_notebook(CHAPTER, _unscaled),
        source,
        "exercise_scaled_dot_product_attention",
    )


SWALLOW_EXCEPTIONS = """
import sys
ip = get_ipython()
ip.set_custom_exc((BaseException,), lambda *a, **k: None)
ip.showtraceback = lambda *a, **k: None
ip.showsyntaxerror = lambda *a, **k: None
sys.excepthook = lambda *a, **k: None
"""

MOCK_MODULES = """
import sys, types, importlib.abc, importlib.machinery

class _Fake(types.ModuleType):
    def __getattr__(self, name):
        return lambda *a, **k: True

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("autograder", "solutions", "nbgrader", "tests"):
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        return _Fake(spec.name)
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _Finder())
for name in ["autograder", "autograder.grading.judging.judge", "autograder.grading.sealed.probe", "solutions",
             "solutions.self_attention", "nbgrader", "_grader_probe"]:
    sys.modules[name] = _Fake(name)
"""

POISON = f"""
import os, pathlib
evil = "def scaled_dot_product_attention(q, k, v, mask=None):\\n    return q, q\\n"
for folder in ["solutions", "{REPO}/solutions", "/tmp/solutions"]:
    try:
        os.makedirs(folder, exist_ok=True)
        pathlib.Path(folder, "self_attention.py").write_text(evil)
        pathlib.Path(folder, "__init__.py").write_text("")
    except OSError as exc:
        print("could not poison", folder, exc)
"""


FAKE_REPORT = """
import json, os, torch
print(json.dumps({"score": 10.0, "max_score": 10.0, "passed": True}))
print("PASS sdpa_basic 2/2")
for i in range(10):
    for name in (f"result_{i}.pt", f"/tmp/result_{i}.pt"):
        try:
            torch.save([[{"value": "passed"}]], name)
        except OSError:
            pass
"""

DELEGATE = """
import torch.nn.functional as F

def scaled_dot_product_attention(q, k, v, mask=None):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    return out, weights
"""

DELEGATE_HIDDEN = DELEGATE.replace(
    "F.scaled_dot_product_attention(",
    'getattr(F, "scaled_dot_" + "product_attention")(',
)

DAEMON = """
import subprocess
subprocess.Popen(["sleep", "987"], start_new_session=True)
"""


def _attack_notebooks(d):
    def answers_then(cell):
        return with_extra_cell(
            student_notebook(CHAPTER), cell, "exercise_SelfAttention"
        )

    nbs = {
        "unscaled": student_notebook(CHAPTER, _unscaled),
        "stub": release_notebook(CHAPTER),
        "patch_comparisons": _unscaled_with_cell(PATCH_COMPARISONS),
        "swallow_exceptions": stub_with_cell(SWALLOW_EXCEPTIONS),
        "mock_modules": _unscaled_with_cell(MOCK_MODULES),
        "poison_reference": _unscaled_with_cell(POISON),
        "steal_reference": stub_with_cell(STEAL),
        "fake_report": stub_with_cell(FAKE_REPORT),
        "delegate": answers_then(DELEGATE),
        "delegate_hidden": answers_then(DELEGATE_HIDDEN),
        "daemon": answers_then(DAEMON),
    }
    # deleting every given cell, or rewriting test cells, changes nothing
    trimmed = student_notebook(CHAPTER)
    trimmed.cells = [
        c
        for c in trimmed.cells
        if c.cell_type != "code"
        or c.metadata.get("nbgrader", {}).get("solution")
        or "import" in c.source
    ]
    nbs["tests_deleted"] = trimmed
    edited = release_notebook(CHAPTER)
    for c in edited.cells:
        if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("solution"):
            if "expect" in c.source:
                c.source = "print('all checks passed')"
    nbs["tests_edited_stub"] = edited
    return {name: write(nb, d / f"{name}.ipynb") for name, nb in nbs.items()}


def _batch(notebooks, *extra):
    run = grade_cli(
        *notebooks.values(), "--assignment", CHAPTER, "--json", "--jobs", "2",
        "--seed", "7", *extra,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines()]
    return dict(zip(notebooks, results, strict=True))


def _reference_digest():
    return {
        p: hashlib.sha256((paths.REPO / p).read_bytes()).hexdigest()
        for p in [
            "solutions/self_attention.py",
            "autograder/hidden_tests/self_attention.py",
        ]
    }


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    before = _reference_digest()
    notebooks = _attack_notebooks(tmp_path_factory.mktemp("attacks"))
    results = _batch(notebooks)
    assert _reference_digest() == before, "a submission changed the course's files"
    return results


@pytest.fixture(scope="module")
def unjailed(tmp_path_factory):
    """The attacks that only the sandbox stops, graded without it: they must work there."""
    d = tmp_path_factory.mktemp("unjailed")
    return _batch(
        {"steal_reference": write(stub_with_cell(STEAL), d / "steal.ipynb")},
        "--no-sandbox",
    )


def test_baselines(attacked):
    assert attacked["stub"]["score"] == 0
    assert 0 < attacked["unscaled"]["score"] < attacked["unscaled"]["max_score"]


@pytest.mark.parametrize(
    "attack, baseline",
    [
        ("patch_comparisons", "unscaled"),
        ("swallow_exceptions", "stub"),
        ("mock_modules", "unscaled"),
        ("poison_reference", "unscaled"),
        ("steal_reference", "stub"),
        ("fake_report", "stub"),
        ("tests_edited_stub", "stub"),
    ],
)
def test_a_trick_earns_nothing(attacked, attack, baseline):
    assert scores_by_test(attacked[attack]) == scores_by_test(attacked[baseline]), (
        attacked[attack]
    )
    assert attacked[attack]["max_score"] == attacked[baseline]["max_score"] == 10


def test_deleting_given_cells_changes_nothing(attacked):
    assert attacked["tests_deleted"]["score"] == 10, attacked["tests_deleted"]


def test_stealing_works_without_the_sandbox_so_the_attack_is_real(unjailed):
    # without the jail the reference answers are read and run: they earn points, and its
    # top-level exec is flagged for the instructor's review (never a point either way)
    stolen = unjailed["steal_reference"]
    assert stolen["score"] > 0
    assert any("exec" in f for f in stolen["flags"]), stolen["flags"]


@pytest.mark.parametrize("name", ["delegate", "delegate_hidden"])
def test_delegating_to_pytorch_earns_nothing_and_says_why(attacked, name):
    tests = {t["id"]: t for t in attacked[name]["tests"]}
    for test_id in ("sdpa_basic", "sdpa_masked", "sdpa_edge_cases"):
        assert tests[test_id]["score"] == 0
        # PyTorch's attention is switched off while these tests run: the guard's message
        message = tests[test_id]["message"]
        assert (
            message.startswith(guard.MARK) and "write the attention yourself" in message
        )
    # the other exercises are the student's own work and keep their points
    assert tests["causal_mask_values"]["score"] == 1


def test_processes_a_submission_starts_die_with_its_kernel(attacked):
    # a process started by the student's code cannot reach the sealed child: the answers
    # are the student's own and keep their points
    assert attacked["daemon"]["score"] > 0
    leftover = subprocess.run(["pgrep", "-f", "sleep 987"], capture_output=True)
    assert leftover.returncode == 1, leftover.stdout


# Chapter 8: delegation hidden by switching PyTorch's watchers off (round 3's evasion):
# the kernels are switched off below any watcher.
FLASH = "08_efficient_attention"
SWITCHED_OFF = """
import torch
import torch.nn.functional as F

def flash_attention(q, k, v, block_size=64, causal=False):
    name = "".join(map(chr, [115, 99, 97, 108, 101, 100, 95, 100, 111, 116, 95, 112, 114,
                             111, 100, 117, 99, 116, 95, 97, 116, 116, 101, 110, 116, 105,
                             111, 110]))
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        return getattr(F, name)(q, k, v, is_causal=causal)
"""
WRONG_FLASH = """
import torch

def flash_attention(q, k, v, block_size=64, causal=False):
    return torch.zeros(*q.shape[:-1], v.size(-1), dtype=q.dtype)
"""


def _flash_answer(source):
    nb = student_notebook(FLASH)
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id == "exercise_flash_attention":
            cell.source = source
    return nb


@pytest.fixture(scope="module")
def switched_off(tmp_path_factory):
    d = tmp_path_factory.mktemp("switched_off")
    notebooks = {
        name: write(_flash_answer(source), d / f"{name}.ipynb")
        for name, source in (("evasion", SWITCHED_OFF), ("wrong", WRONG_FLASH))
    }
    run = grade_cli(*notebooks.values(), "--assignment", FLASH, "--json", "--seed", "7")
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines()]
    return dict(zip(notebooks, results, strict=True))


def test_switching_pytorchs_modes_off_earns_what_a_wrong_answer_earns(switched_off):
    evasion, wrong = switched_off["evasion"], switched_off["wrong"]
    assert evasion["score"] == wrong["score"] < evasion["max_score"], evasion
    assert scores_by_test(evasion) == scores_by_test(wrong)
    # the tests of the exercise the evasion answers (not the chapter's other flash tests)
    ids = {
        t.id for t in load_chapter_tests(FLASH).tests if t.exercise == "flash_attention"
    }
    flash = [t for t in evasion["tests"] if t["id"] in ids]
    assert flash
    for test in flash:
        assert test["score"] == 0
        assert test["message"].startswith(guard.MARK), test["message"]
    assert any("torch._C" in f for f in evasion["flags"]), evasion["flags"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))

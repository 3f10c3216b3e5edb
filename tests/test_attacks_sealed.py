"""Round-3 attacks by a student who has read the grader: on the hidden tests' plans, on the
sealed child that runs them, and on what was the watch (now the attention guard). Each attack is graded in one batch beside
the same wrong answer alone (chapter 3 with unscaled scores) and must earn no more than
it; an honest notebook graded in the same batch keeps full marks.

Each cell's comment says what it tried; the closing note of the issue that added them
gives what each scored on the grader before (plans on disk, one probe cell per test).
"""

import json

import pytest

from autograder.grading.sealed import guard
from tests.notebooks import (
    QUICK_LIMITS,
    grade_cli,
    student_notebook,
    with_extra_cell,
    write,
)

pytestmark = pytest.mark.slow
CHAPTER = "03_self_attention"

# Finds the hidden tests' inputs wherever the grader leaves them, computes PyTorch's
# fused attention on them outside any watch, and hands the answers over in a file the
# exercise then reads (it waits for them half a second).
_ANSWERS = """
import glob, os, pickle, threading, time, hashlib
import torch, torch.nn.functional as F
from ipykernel import get_connection_file
_folder = os.path.dirname(get_connection_file())
_store = "/tmp/answers.pkl"

def _key(q, k, v):
    return hashlib.sha256(b"".join(t.numpy().tobytes() for t in (q, k, v))).hexdigest()

def _harvest_once():
    found = {}
    for path in glob.glob(_folder + "/*.pt") + glob.glob("/tmp/*.pt") + glob.glob("*.pt"):
        try:
            plan = torch.load(path, weights_only=True)
        except Exception:
            continue
        tests = plan["tests"] if isinstance(plan, dict) and "tests" in plan else [plan]
        for test in tests:
            if isinstance(test, dict) and "guarded" in test:
                test["guarded"] = False  # and rewrite the phase the test runs in
            for call in test.get("calls", []) if isinstance(test, dict) else []:
                args = call["args"]
                if len(args) >= 3 and all(isinstance(a, torch.Tensor) for a in args[:3]):
                    mask = args[3] if len(args) > 3 else call["kwargs"].get("mask")
                    out = F.scaled_dot_product_attention(*args[:3], attn_mask=mask)
                    found[_key(*args[:3])] = out
        try:
            torch.save(plan, path)
        except Exception:
            pass
    if found:
        with open(_store + ".part", "wb") as f:
            pickle.dump(found, f)
        os.replace(_store + ".part", _store)

def _harvest_forever():
    while True:
        _harvest_once()
        time.sleep(0.001)
"""

_LOOKUP = """
_exercise_right = scaled_dot_product_attention

def scaled_dot_product_attention(q, k, v, mask=None):
    out, weights = _exercise_right(q, k, v, mask)
    deadline = time.time() + 0.5  # a harvester polls every millisecond
    while time.time() < deadline:
        try:
            with open(_store, "rb") as f:
                return pickle.load(f)[_key(q, k, v)], weights
        except Exception:
            time.sleep(0.01)
    return out, weights
"""

# Asks the grader's stand-in for scaled_dot_product_attention (the course's answer, which
# the grader gives only in a later exercise's second run) from inside the exercise's own
# test, for whatever run it may be serving; with FORGE, after writing a result for every
# test first, so that the grader would think the own tests done and hand a second run over.
_ASK_THE_STAND_IN = """
import json, os, time, torch
from ipykernel import get_connection_file
_folder = os.path.dirname(get_connection_file())
_unscaled = scaled_dot_product_attention

def _encoded(value):
    tensors, blobs, offset = [], [], 0
    def plain(v):
        nonlocal offset
        if isinstance(v, torch.Tensor):
            raw = v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            tensors.append({"dtype": str(v.dtype)[6:], "shape": list(v.shape),
                            "offset": offset, "nbytes": len(raw)})
            blobs.append(raw)
            offset += len(raw)
            return {"__tensor__": len(tensors) - 1}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    header = json.dumps({"outcomes": plain(value), "tensors": tensors}).encode()
    return b"AGR1" + len(header).to_bytes(4, "little") + header + b"".join(blobs)

def scaled_dot_product_attention(q, k, v, mask=None):
    if FORGE:
        for i in range(12):
            with open(f"{_folder}/result_{i}.res", "wb") as f:
                f.write(_encoded([{"value": None}]))
    request = _encoded([{"name": "scaled_dot_product_attention", "kind": "call",
                         "args": [q, k, v, mask], "kwargs": {}}])
    for index in range(12):
        with open(f"{_folder}/oracle_{index}_99.req", "wb") as f:
            f.write(request)
    deadline = time.time() + 0.3
    while time.time() < deadline:
        for index in range(12):
            try:
                reply = torch.load(f"{_folder}/oracle_{index}_99.rep", weights_only=True)
                return tuple(reply["value"])
            except Exception:
                pass
        time.sleep(0.005)
    return _unscaled(q, k, v, mask)
"""

ATTACKS = {
    "stand_in_in_own_test": "FORGE = False\n" + _ASK_THE_STAND_IN,
    "stand_in_after_forged_results": "FORGE = True\n" + _ASK_THE_STAND_IN,
    # the example: the plans read at top level, the answers computed there
    "plans_at_top_level": _ANSWERS + "_harvest_once()\n",
    # and rewritten, with the fused function bound inside an `if`
    "watch_emptied_if_bound": _ANSWERS
    + """
_harvest_once()
if True:
    from torch.nn.functional import scaled_dot_product_attention as _fused
def scaled_dot_product_attention(q, k, v, mask=None):
    out = _fused(q, k, v, attn_mask=mask)
    return out, torch.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)
""",
    # a thread left running reads and rewrites the plans as they appear
    "plans_thread": _ANSWERS
    + "threading.Thread(target=_harvest_forever, daemon=True).start()\n",
    # an IPython hook starts the reader when the grader's cell comes
    "pre_run_cell_hook": _ANSWERS
    + """
def _hook(info):
    threading.Thread(target=_harvest_forever, daemon=True).start()
get_ipython().events.register("pre_run_cell", _hook)
""",
    # a process left running, outside the kernel's threads, does the same
    "plans_process": _ANSWERS
    + """
if os.fork() == 0:
    try:
        _harvest_forever()
    finally:
        os._exit(0)
""",
    # the exercise itself tries to get help from another thread or process
    "thread_inside": """
import threading, torch.nn.functional as F
def scaled_dot_product_attention(q, k, v, mask=None):
    box = {}
    def work():
        box["out"] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    t = threading.Thread(target=work); t.start(); t.join()
    w = torch.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)
    return box["out"], w
""",
    "fork_inside": """
import os, pickle, torch.nn.functional as F
def scaled_dot_product_attention(q, k, v, mask=None):
    r, w = os.pipe()
    if os.fork() == 0:
        os.write(w, pickle.dumps(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
        os._exit(0)
    out = pickle.loads(os.read(r, 1 << 24))
    weights = torch.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)
    return out, weights
""",
    # wakes the frozen processes from inside the test, to let a helper answer
    "wake_the_others": _ANSWERS
    + "threading.Thread(target=_harvest_forever, daemon=True).start()\n"
    + """
import signal
_before_wake = scaled_dot_product_attention
def scaled_dot_product_attention(q, k, v, mask=None):
    for pid in range(1, 400):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    return _before_wake(q, k, v, mask)
""",
    # library attention by routes the old list did not name
    "multi_head_forward": """
import torch.nn.functional as F
def scaled_dot_product_attention(q, k, v, mask=None):
    batch, n, m, d = q.shape[:-2], q.size(-2), k.size(-2), q.size(-1)
    q3, k3 = q.reshape(-1, n, d).transpose(0, 1), k.reshape(-1, m, d).transpose(0, 1)
    eye = torch.eye(d)
    if mask is not None:
        mask = ~mask.expand(*batch, n, m).reshape(-1, n, m)
    _, w = F.multi_head_attention_forward(
        q3, k3, k3, d, 1, None, None, None, None, False, 0.0, eye, None,
        training=False, need_weights=True, attn_mask=mask,
        use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye,
        v_proj_weight=eye)
    w = torch.nan_to_num(w).reshape(*batch, n, m)
    return w @ v, w
""",
    "aten_operator": """
def scaled_dot_product_attention(q, k, v, mask=None):
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q[:, None], k[:, None], v[:, None], attn_mask=None if mask is None else mask[:, None])[0][:, 0]
    w = torch.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)
    return out, w
""",
    # a loader patched at top level computes the answers when the plans are read
    "patched_loader": """
import torch.nn.functional as F
_load = torch.load
_cache = {}
def _spying_load(*a, **k):
    plan = _load(*a, **k)
    for test in plan.get("tests", []) if isinstance(plan, dict) else []:
        for call in test["calls"]:
            q, k_, v = (call["args"] + [None] * 3)[:3]
            if all(isinstance(t, torch.Tensor) for t in (q, k_, v)):
                _cache[id(q)] = F.scaled_dot_product_attention(q, k_, v)
    return plan
torch.load = _spying_load
""",
    # a thread left running keeps writing result files that pass, racing the child
    "forged_results": """
import os, threading, time, torch
from ipykernel import get_connection_file
_folder = os.path.dirname(get_connection_file())
def _forge():
    while True:
        for i in range(12):
            try:
                torch.save([{"value": None}], f"{_folder}/result_{i}.pt")
            except Exception:
                pass
        time.sleep(0.001)
threading.Thread(target=_forge, daemon=True).start()
""",
}


def _notebooks(folder):
    unscaled = lambda s: s.replace(" / math.sqrt(d_k)", "")  # noqa: E731
    nbs = {
        "honest": student_notebook(CHAPTER),
        "unscaled": student_notebook(CHAPTER, unscaled),
    }
    for name, cell in ATTACKS.items():
        nb = student_notebook(CHAPTER, unscaled)
        source = cell + (_LOOKUP if cell.startswith(_ANSWERS) else "")
        nbs[name] = with_extra_cell(nb, source, "exercise_SelfAttention")
    return {name: write(nb, folder / f"{name}.ipynb") for name, nb in nbs.items()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    notebooks = _notebooks(tmp_path_factory.mktemp("sealed"))
    run = grade_cli(
        *notebooks.values(), "--assignment", CHAPTER, "--json", "--jobs", "2",
        "--seed", "11", *QUICK_LIMITS,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines()]
    return dict(zip(notebooks, results, strict=True))


def test_the_honest_neighbour_keeps_full_marks(graded):
    assert graded["honest"]["score"] == graded["honest"]["max_score"] == 10
    assert 0 < graded["unscaled"]["score"] < 10


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_attack_earns_no_more_than_the_wrong_answer_alone(graded, attack):
    result, alone = graded[attack], graded["unscaled"]
    assert result["graded"], result
    assert result["score"] <= alone["score"], json.dumps(result, indent=1)[:3000]


@pytest.mark.parametrize(
    "attack", ["multi_head_forward", "aten_operator", "patched_loader"]
)
def test_library_attention_by_any_route_is_switched_off(graded, attack):
    sdpa = [t for t in graded[attack]["tests"] if t["id"].startswith("sdpa")]
    assert sdpa and all(t["score"] == 0 for t in sdpa)
    if attack != "patched_loader":  # its loader fails while the plans are read
        assert any(t["message"].startswith(guard.MARK) for t in sdpa), sdpa


def test_a_window_the_grader_cannot_open_is_no_grade(tmp_path, monkeypatch):
    """The grader's own failure while the tests run (here its disk refuses the plans)
    records no grade for the notebook, even after the second try, and says why."""
    from autograder.grading.grade import grade_notebook
    from autograder.grading.sealed.window import SealedWindow

    def full_disk(self, child):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SealedWindow, "_hand_over", full_disk)
    notebook = write(student_notebook(CHAPTER), tmp_path / "right.ipynb")
    result = grade_notebook(notebook, CHAPTER, seed=3)
    assert not result["graded"] and result["score"] == 0
    assert "No space left on device" in result["message"], result["message"]
    assert "grade this notebook again" in result["message"]

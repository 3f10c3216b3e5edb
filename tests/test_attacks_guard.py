"""Round-4 attacks, on the design where PyTorch's attention is switched off rather than
watched (``grading/sealed/guard``): the issue's attacks 1 and 3, honest notebooks that the old
watch and code reading wrongly cost points (6a, 6b, 6c), and new attacks on the guard,
its arming and the two phases of the sealed window.

Each cheat is graded in one batch beside the same wrong answer alone (chapter 3 with
unscaled scores) and must earn no more than it; where it reaches past what any guard in
the student's own process can stop (Python's plain attention, with the grader's probe
edited by a hook), it must at least be flagged for review. Honest notebooks keep full
marks.
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

# The exercise redefined: PyTorch's attention computes the output, the weights are right.
_FUSED = """
import math, torch
import torch.nn.functional as F
def _weights(q, k, mask):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, dim=-1))
"""

# an answer that computes with ``_mhaf``, PyTorch's multi_head_attention_forward however
# the cheat came by it
_MHA_ANSWER = """
def scaled_dot_product_attention(q, k, v, mask=None):
    d, n = q.size(-1), q.size(-2)
    eye = torch.eye(d)
    x = q.reshape(-1, n, d).transpose(0, 1)
    out, _ = _mhaf(x, x, x, d, 1, None, None, None, None, False, 0.0, eye, None,
                   training=False, need_weights=False, use_separate_proj_weight=True,
                   q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye)
    return out.transpose(0, 1).reshape(q.shape), _weights(q, k, mask)
"""

CHEATS = {
    # attack 1: a post_run_cell hook registered through an alias swaps the exercise, after
    # the grader's setup cell, for one that calls PyTorch's attention
    "hook_swaps_the_exercise": _FUSED
    + """
_ev = get_ipython().events
def _swap(result):
    ns = get_ipython().user_ns
    def fused(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), _weights(q, k, mask)
    ns["scaled_dot_product_attention"] = fused
_ev.register("post_run_cell", _swap)
""",
    # attack 3: PyTorch's modes switched off through getattr(torch, "_C")
    "disabled_modes": _FUSED
    + """
_C = getattr(torch, "_C")
def scaled_dot_product_attention(q, k, v, mask=None):
    with _C.DisableTorchFunction(), _C._DisableTorchDispatch():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out, _weights(q, k, mask)
""",
    # new: every Python registration destroyed, then the fused kernel by its operator
    "destroy_registrations": _FUSED
    + """
import gc
for _obj in gc.get_objects():
    if isinstance(_obj, torch.library.Library):
        _obj._destroy()
def scaled_dot_product_attention(q, k, v, mask=None):
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q[:, None], k[:, None], v[:, None],
        attn_mask=None if mask is None else mask[:, None])[0][:, 0]
    return out, _weights(q, k, mask)
""",
    # new: the kernel handle PyTorch hands out, taken before the tests
    "kernel_handle": _FUSED
    + """
_handle = torch.library.get_kernel("aten::_scaled_dot_product_flash_attention_for_cpu", "CPU")
def scaled_dot_product_attention(q, k, v, mask=None):
    ks = torch._C._dispatch_keyset_full()
    out = _handle.call_boxed(ks, q[:, None], k[:, None], v[:, None])[0][:, 0]
    return out, _weights(q, k, mask)
""",
    # new: a scripted function, compiled while unarmed
    "jit_script": _FUSED
    + """
@torch.jit.script
def _scripted(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)
def scaled_dot_product_attention(q, k, v, mask=None):
    return _scripted(q, k, v), _weights(q, k, mask)
""",
    # new: vmap over the fused kernel
    "vmap": _FUSED
    + """
def scaled_dot_product_attention(q, k, v, mask=None):
    out = torch.vmap(lambda a, b, c: F.scaled_dot_product_attention(a, b, c))(q, k, v)
    return out, _weights(q, k, mask)
""",
    # new: the module's fast path (eval, no grad), with identity projections
    "mha_fast_path": _FUSED
    + """
def scaled_dot_product_attention(q, k, v, mask=None):
    d = q.size(-1)
    mha = torch.nn.MultiheadAttention(d, 1, batch_first=True, bias=False).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(d).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(d))
        x = q.reshape(-1, q.size(-2), d)
        out = mha(x, x, x, need_weights=False)[0].reshape(q.shape)
    return out, _weights(q, k, mask)
""",
    # round 5: a function built from the code object before arming, and PyTorch's
    # other attention in Python (the quantizable module), reached by a built name
    "function_from_code": _FUSED
    + """
import types
_mhaf = types.FunctionType(F.multi_head_attention_forward.__code__, F.__dict__, "mine")
"""
    + _MHA_ANSWER,
    "quantizable_by_built_name": _FUSED
    + """
import importlib
_q = importlib.import_module("torch.ao.nn." + "quantizable")
def scaled_dot_product_attention(q, k, v, mask=None):
    d, n = q.size(-1), q.size(-2)
    mha = _q.MultiheadAttention(d, 1, bias=False, batch_first=True)
    with torch.no_grad():
        mha.linear_Q.weight.copy_(torch.eye(d))
        mha.linear_K.weight.copy_(torch.eye(d))
        mha.linear_V.weight.copy_(torch.eye(d))
        mha.out_proj.weight.copy_(torch.eye(d))
        x = q.reshape(-1, n, d)
        out = mha(x, k.reshape(-1, n, d), v.reshape(-1, n, d), need_weights=False)[0]
    return out.reshape(q.shape), _weights(q, k, mask)
""",
    # new: F.multi_head_attention_forward bound to a name before the tests
    "aliased_python_mha": _FUSED
    + "from torch.nn.functional import multi_head_attention_forward as _mhaf\n"
    + _MHA_ANSWER,
    # new: the guard's refusal caught, and the output taken from a cache filled while
    # the kernel was unarmed (the inputs are drawn at grading time: nothing to cache)
    "cache_filled_unarmed": _FUSED
    + """
_cache = {}
for _n in (1, 2, 3, 4, 5, 6, 7, 8):
    _q = torch.randn(2, _n, 8)
    _cache[_n] = F.scaled_dot_product_attention(_q, _q, _q)
def scaled_dot_product_attention(q, k, v, mask=None):
    try:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    except RuntimeError:
        out = _cache.get(q.size(-2), q)
    return out, _weights(q, k, mask)
""",
    # new: a hook that stops the child from sealing itself at all (the probe's seal
    # emptied): no sealed child, no test runs
    "hook_stops_sealing": _FUSED
    + """
def _unseal(result):
    probe = get_ipython().user_ns.get("_grader" + "_probe")
    if probe is not None:
        probe.seal = lambda: None
get_ipython().events.register("post_run_cell", _unseal)
def scaled_dot_product_attention(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), _weights(q, k, mask)
""",
    # new: a hook that lets the child seal itself once but not arm the guard (the
    # probe's second seal emptied): the grader never sees the second filter
    "hook_stops_arming": _FUSED
    + """
def _unarm(result):
    probe = get_ipython().user_ns.get("_grader" + "_probe")
    if probe is not None and not hasattr(probe, "_calls"):
        probe._calls, first = [], probe.seal
        def once():
            probe._calls.append(1)
            if len(probe._calls) == 1:
                first()
        probe.seal = once
get_ipython().events.register("post_run_cell", _unarm)
def scaled_dot_product_attention(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), _weights(q, k, mask)
""",
    # new: the kernel arms itself early with two filters of its own (no guard to dodge:
    # it only switches its own attention off sooner)
    "arms_itself_early": _FUSED
    + """
import ctypes, struct
def _filter():
    prog = struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000)
    buf = ctypes.create_string_buffer(prog)
    class P(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    p = P(1, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None)
    libc.prctl(38, 1, 0, 0, 0)
    libc.prctl(22, 2, ctypes.addressof(p), 0, 0)
_filter(); _filter()
def scaled_dot_product_attention(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), _weights(q, k, mask)
""",
    # new: a helper process computes the fused attention for inputs sent through a pipe
    "helper_process": _FUSED
    + """
import os, pickle
_to_helper, _from_child = os.pipe()
_to_child, _from_helper = os.pipe()
if os.fork() == 0:
    while True:
        q, k, v, mask = pickle.loads(os.read(_to_helper, 1 << 24))
        os.write(_from_helper, pickle.dumps(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
def scaled_dot_product_attention(q, k, v, mask=None):
    os.write(_from_child, pickle.dumps((q, k, v, mask)))
    return pickle.loads(os.read(_to_child, 1 << 24)), _weights(q, k, mask)
""",
    # new: the exercise itself adds no filter but hides PyTorch's attention in autocast
    # and nested tensors
    "autocast": _FUSED
    + """
def scaled_dot_product_attention(q, k, v, mask=None):
    with torch.autocast("cpu", dtype=torch.float32):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out, _weights(q, k, mask)
""",
}

# beyond any in-process guard: Python's own attention with the grader's probe edited.
# Not stopped, but never silent: flagged for the instructor's review.
FLAGGED_ONLY = {
    "hook_keeps_python_mha": _FUSED
    + """
def _keep(result):
    probe = get_ipython().user_ns.get("_grader" + "_probe")
    if probe is not None:
        probe.switch_off_python_attention = lambda: None
get_ipython().events.register("post_run_cell", _keep)
def scaled_dot_product_attention(q, k, v, mask=None):
    d, n = q.size(-1), q.size(-2)
    eye = torch.eye(d)
    x = q.reshape(-1, n, d).transpose(0, 1)
    out, _ = F.multi_head_attention_forward(
        x, x, x, d, 1, None, None, None, None, False, 0.0, eye, None, training=False,
        need_weights=True, use_separate_proj_weight=True, q_proj_weight=eye,
        k_proj_weight=eye, v_proj_weight=eye)
    return out.transpose(0, 1).reshape(q.shape), _weights(q, k, mask)
""",
}

# honest notebooks the old design cost points (6a: a dead first try above the answer)
FIRST_TRY = """
import torch.nn.functional as F
def scaled_dot_product_attention(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None
"""


def _notebooks(folder):
    unscaled = lambda s: s.replace(" / math.sqrt(d_k)", "")  # noqa: E731
    nbs = {
        "honest": student_notebook(CHAPTER),
        "unscaled": student_notebook(CHAPTER, unscaled),
        "dead_first_try": student_notebook(
            CHAPTER,
            lambda s: FIRST_TRY + s if "def scaled_dot_product_attention" in s else s,
        ),
    }
    for name, cell in {**CHEATS, **FLAGGED_ONLY}.items():
        nb = student_notebook(CHAPTER, unscaled)
        nbs[name] = with_extra_cell(nb, cell, "exercise_SelfAttention")
    return {name: write(nb, folder / f"{name}.ipynb") for name, nb in nbs.items()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    notebooks = _notebooks(tmp_path_factory.mktemp("guarded"))
    run = grade_cli(
        *notebooks.values(), "--assignment", CHAPTER, "--json", "--jobs", "2",
        "--seed", "13", *QUICK_LIMITS, timeout=1800,
    )  # fmt: skip
    results = dict(
        zip(notebooks, map(json.loads, run.stdout.splitlines()), strict=True)
    )
    # the one kept from arming is no grade (exit 4); every other notebook is graded
    ungraded = {name for name, r in results.items() if not r["graded"]}
    assert run.returncode == (4 if ungraded else 0), run.stderr[-3000:]
    assert ungraded <= {"hook_stops_arming"}, ungraded
    return results


def test_honest_notebooks_keep_full_marks(graded):
    for name in ("honest", "dead_first_try"):
        assert graded[name]["score"] == graded[name]["max_score"] == 10, graded[name]
    assert graded["honest"]["flags"] == graded["dead_first_try"]["flags"] == []
    assert 0 < graded["unscaled"]["score"] < 10


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_a_cheat_earns_no_more_than_the_wrong_answer_alone(graded, cheat):
    result, alone = graded[cheat], graded["unscaled"]
    assert result["score"] <= alone["score"], json.dumps(result, indent=1)[:3000]


@pytest.mark.parametrize(
    "cheat",
    [
        "disabled_modes",
        "destroy_registrations",
        "kernel_handle",
        "jit_script",
        "vmap",
        "function_from_code",
        "quantizable_by_built_name",
    ],
)
def test_a_refused_call_fails_with_the_guards_message(graded, cheat):
    sdpa = [t for t in graded[cheat]["tests"] if t["id"].startswith("sdpa")]
    assert sdpa and all(t["score"] == 0 for t in sdpa)
    assert all(t["message"].startswith(guard.MARK) for t in sdpa), sdpa


def test_a_child_kept_from_arming_gets_no_grade(graded):
    result = graded["hook_stops_arming"]
    assert not result["graded"] and result["score"] == 0, result
    assert "attention" in result["message"], result["message"]
    unsealed = graded["hook_stops_sealing"]
    assert unsealed["score"] == 0, unsealed


@pytest.mark.parametrize("cheat", sorted(FLAGGED_ONLY) + ["quantizable_by_built_name"])
def test_what_no_guard_can_stop_is_flagged(graded, cheat):
    result = graded[cheat]
    assert result["flags"], result

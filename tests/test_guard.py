"""The attention guard itself (autograder/grading/sealed/guard): built, loaded in a fresh
process, PyTorch's attention computes while unarmed and every route to it is refused once
two seccomp filters arm it (tests/guard_routes.py tries them)."""

import json
import os
import subprocess
import sys

import pytest

from autograder.grading.sealed import guard
from autograder.paths import REPO


@pytest.fixture(scope="module")
def routes():
    guard.ensure()
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "guard_routes.py"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_unarmed_attention_computes(routes):
    assert set(routes["unarmed"].values()) == {"computed"}, routes["unarmed"]


def test_one_filter_does_not_arm(routes):
    assert routes["armed"]["one filter: still computes"] == "computed"


# routes a registration can break in other ways (a recursion, PyTorch's own assertion):
# what matters is that none of them computes
_NOT_COMPUTED = {
    "torch.library impl over the guard, redispatching",
    "fallthrough registered over the guard",
}


def test_every_route_is_refused_once_armed(routes):
    armed = {
        k: v for k, v in routes["armed"].items() if k != "one filter: still computes"
    }
    assert len(armed) >= 25
    computed = [k for k, v in armed.items() if v == "computed"]
    assert not computed, computed
    other = [k for k, v in armed.items() if v != "refused" and k not in _NOT_COMPUTED]
    assert not other, {k: armed[k] for k in other}


def test_the_refusal_says_what_to_write():
    text = guard.refusal("scaled_dot_product_attention")
    assert "switched off" in text and "softmax" in text
    source = guard.SOURCE.read_text()
    assert guard.MESSAGE_TAIL[:60] in source.replace('"\n    "', "")


def test_library_lives_in_a_versioned_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(guard.CACHE_ENV, str(tmp_path))
    path = guard.library_path()
    assert str(path).startswith(str(tmp_path)) and "torch-" in str(path)


def test_an_unbuildable_guard_is_a_grader_fault(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(guard.CACHE_ENV, str(blocked))
    with pytest.raises(guard.GuardUnavailable, match="(?i)nothing is graded"):
        guard.ensure()


_COMPILED = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from autograder.grading.sealed import guard, probe
from autograder.grading.running.sandbox import zygote
torch.ops.load_library(str(guard.library_path()))
if sys.argv[2] == "rewrites off":
    zygote.no_attention_rewrites()

def attention(q, k, v):  # the shape of inductor's first attention pattern
    return torch.matmul(q, k.transpose(-2, -1)).div(8.0).softmax(dim=-1).matmul(v)

compiled = torch.compile(attention)
q = torch.randn(4, 8, 128, 64)
with torch.no_grad():
    expected = attention(q, q, q)
    torch.testing.assert_close(compiled(q, q, q), expected)  # compiled while unarmed
    probe.seal()
    probe.seal()
    try:
        torch.testing.assert_close(compiled(q, q, q), expected)
        print("computed")
    except Exception as exc:
        print("refused" if guard.MARK in str(exc) else f"error {exc}"[:300])
"""


@pytest.mark.slow
def test_an_honest_answer_compiled_with_torch_compile_is_not_refused(tmp_path):
    """inductor rewrites matmul-softmax-matmul into PyTorch's fused attention (the
    control shows it here); the zygote's preload switches that rewrite off in every
    kernel, so a compiled honest answer computes with the guard armed."""
    guard.ensure()
    seen = {}
    for mode in ("rewrites on", "rewrites off"):
        done = subprocess.run(
            [sys.executable, "-c", _COMPILED, str(REPO), mode],
            capture_output=True,
            text=True,
            timeout=600,
            # a fresh compile cache: a graph cached with the rewrite would be reused
            env={
                **os.environ,
                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / mode.replace(" ", "_")),
            },
        )
        seen[mode] = (done.stdout.strip().splitlines() or ["none"])[-1]
        assert done.returncode == 0, done.stderr[-3000:]
    assert seen == {"rewrites on": "refused", "rewrites off": "computed"}, seen


_FAKE_PROC = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
# single-threaded still (as the sealed child is): a user and mount namespace of its own
assert libc.unshare(0x10000000 | 0x00020000) == 0, "unshare"
open("/proc/self/setgroups", "w").write("deny")
open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
from autograder.grading.sealed import guard, probe
torch.ops.load_library(str(guard.library_path()))
assert libc.mount(b"tmpfs", b"/proc", b"tmpfs", 0, None) == 0, "mount"
os.makedirs("/proc/self")
with open("/proc/self/status", "w") as f:
    f.write(f"Seccomp:\\t2\\nSeccomp_filters:\\t0\\nNSpid:\\t{os.getpid()}\\n")
probe.seal()
probe.seal()
q = torch.ones(1, 1, 2, 4)
try:
    F.scaled_dot_product_attention(q, q, q)
    print("computed")
except Exception as exc:
    print("refused" if guard.MARK in str(exc) else f"error {exc}"[:300])
"""


def test_a_faked_proc_status_does_not_disarm_the_guard():
    """A /proc mounted over (in a user namespace of the student's own) to show no
    seccomp filter: the guard trusts only procfs, showing its own pid, and otherwise
    counts itself armed."""
    guard.ensure()
    done = subprocess.run(
        [sys.executable, "-c", _FAKE_PROC, str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "unshare" in done.stderr or "mount" in done.stderr.splitlines()[-1:]:
        pytest.skip("no user namespaces here")
    assert done.stdout.strip().splitlines()[-1:] == ["refused"], done.stderr[-2000:]


def _window(tmp_path):
    from autograder.grading.sealed.window import SealedWindow

    plans = {
        "tests": [
            {"exercise": "a", "calls": [], "guarded": False},
            {"exercise": "b", "calls": [], "guarded": True},
            {"exercise": "c", "calls": [], "guarded": True},
        ],
        "seconds": 1.0,
    }
    return SealedWindow(lambda: None, tmp_path, plans, 1.0, 1.0, 1000)


def test_the_window_hands_over_the_guarded_tests_second(tmp_path):
    window = _window(tmp_path)
    assert window._phase(False)["indices"] == [0]
    assert window._phase(True)["indices"] == [1, 2]


def test_a_guard_that_did_not_refuse_grades_nothing_of_its_phase(tmp_path):
    window = _window(tmp_path)
    window.results = [b"a", b"b", b"c"]
    window.proof = "computed"
    window._check_proof()
    assert window.fault and "did not refuse" in window.fault
    assert window.results == [b"a", None, None]
    refused = _window(tmp_path)
    refused.results, refused.proof = [b"a", b"b", b"c"], "refused"
    refused._check_proof()
    assert refused.fault is None and refused.results == [b"a", b"b", b"c"]


def test_a_guard_that_cannot_load_refuses_to_grade(tmp_path, monkeypatch):
    """A compiled guard that the zygote cannot load (here: not a library at all) stops
    the sandbox before any kernel starts, with a message that names the guard."""
    from autograder.grading.running.sandbox import Sandbox, SandboxUnavailable

    monkeypatch.setenv(guard.CACHE_ENV, str(tmp_path))
    broken = guard.library_path()
    broken.parent.mkdir(parents=True)
    broken.write_text("not a shared library")
    with pytest.raises(SandboxUnavailable, match="attention guard") as raised:
        Sandbox().close()
    assert "Nothing was graded" in str(raised.value)

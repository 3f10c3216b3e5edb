"""PyTorch's attention written in Python: every such function of the installed PyTorch
is classified (a new PyTorch that adds one fails here), and in the guarded phase each is
switched off by its code, wherever it is held."""

import importlib
import importlib.util
import inspect
import pathlib
import subprocess
import sys

import pytest

from autograder import paths
from autograder.grading.sealed import guard, probe, python_attention
from autograder.grading.sealed.python_attention import ATTENTION, NOT_ATTENTION


def _resolve(entry: str):
    module, qualname = entry.split(":")
    owner = importlib.import_module(module)
    for part in qualname.split("."):
        owner = inspect.getattr_static(owner, part)
    return owner


def test_every_python_attention_of_this_pytorch_is_classified():
    found = python_attention.discover()
    unclassified = found - set(ATTENTION) - set(NOT_ATTENTION)
    assert not unclassified, (
        "PyTorch has Python functions that may compute attention which the course has "
        f"not classified; add each to ATTENTION or NOT_ATTENTION: {sorted(unclassified)}"
    )
    assert not set(ATTENTION) & set(NOT_ATTENTION)
    assert len(found) > 30  # the reading found what it should


def test_every_classified_function_is_still_there():
    """No stale entry: each was found in this PyTorch, or is resolved here."""
    found = python_attention.discover()
    for entry in [*ATTENTION, *NOT_ATTENTION]:
        if entry in python_attention.BY_HAND:
            assert inspect.isfunction(_resolve(entry)), entry
        else:
            assert entry in found, entry


def test_every_switched_off_function_has_a_code_key():
    site = pathlib.Path(importlib.util.find_spec("torch").origin).parent.parent
    keys = python_attention.by_code_key()
    assert len(keys) == len(ATTENTION)
    for path, qualname in keys:
        assert (site / path).is_file(), path
        assert f"def {qualname.rsplit('.', 1)[-1]}(" in (site / path).read_text()


def test_the_refusal_says_what_the_guard_says_and_keeps_free_variables():
    tail = probe.REFUSAL_TAIL
    probe.REFUSAL_TAIL = guard.MESSAGE_TAIL
    try:

        def outer():
            a, b = 1, 2

            def inner(x):
                return x + a + b

            return inner

        inner = outer()
        inner.__code__ = probe.refusing_code(
            inner.__code__, "F.multi_head_attention_forward"
        )
        with pytest.raises(RuntimeError) as raised:
            inner(1)
        assert str(raised.value) == guard.refusal("F.multi_head_attention_forward")
        assert set(inner.__code__.co_names) <= {"RuntimeError", "print"}
    finally:
        probe.REFUSAL_TAIL = tail


SWITCHED_OFF = r"""
import sys, types
sys.path.insert(0, {repo!r})
import torch
import torch.nn.functional as F
from torch.ao.nn.quantizable import MultiheadAttention as QuantizableMHA
from autograder.grading.sealed import probe, python_attention, guard
probe.PYTHON_ATTENTION = python_attention.by_code_key()
probe.REFUSAL_TAIL = guard.MESSAGE_TAIL
mhaf = F.multi_head_attention_forward
kept = mhaf
made = types.FunctionType(mhaf.__code__, mhaf.__globals__, "mine")
copied = types.FunctionType(mhaf.__code__.replace(), mhaf.__globals__)
x = torch.randn(2, 1, 4)
modules = [torch.nn.MultiheadAttention(4, 1), QuantizableMHA(4, 1)]
import gc
gc.freeze()  # as the jail's warm process does
probe.switch_off_python_attention()
calls = [lambda: kept(x), lambda: made(x), lambda: copied(x),
         lambda: F.multi_head_attention_forward(x)]
calls += [lambda m=m: m(x, x, x) for m in modules]
for call in calls:
    try:
        call()
        print("computed")
    except Exception as exc:
        print("refused" if str(exc).startswith(guard.MARK) else repr(exc)[:200])
"""


def test_python_attention_is_switched_off_wherever_it_is_held():
    done = subprocess.run(
        [sys.executable, "-c", SWITCHED_OFF.format(repo=str(paths.REPO))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["refused"] * 6, done.stdout + done.stderr[-2000:]

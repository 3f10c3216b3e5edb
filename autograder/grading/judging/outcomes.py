"""Untrusted outcomes made safe to judge.

A hidden test's outcomes come back from the student's kernel, so they hold whatever the
student's code put there. :func:`validated` accepts only what ``probe.py`` writes (per
call, ``{"value": ...}`` or ``{"error": "..."}``), bounded in size. Error messages and
dict keys are cut short; a call whose outcome is
malformed or too large becomes an error outcome that says so, and a result that is no
list of outcomes at all becomes one message for the test. The judge then meets nothing
it cannot handle, whatever the student's code wrote.

Tensors must be plain dense CPU tensors of at most ``MAX_ELEMENTS`` elements, and a
test's outcomes together at most ``MAX_TOTAL_ELEMENTS``: a fixed cap, far above any
hidden test's outputs (the largest expected tensor has 102,400 elements, a test's
outputs together 108,544), so a right answer is never refused and a wrong one can cost
the grader little memory.
"""

from __future__ import annotations

import torch

from autograder.grading.sealed.probe import Outcome

MAX_CALLS = 64  # calls of one hidden test (the most any test makes is 8)
MAX_ERROR = 400  # characters of an error message (the probe's own are at most 400)
MAX_NAME = 200  # characters of a dict key in a value
MAX_STRING = 10_000  # characters of a string value
MAX_ITEMS = 1_000  # items of one list or dict in a value
MAX_DEPTH = 6  # nesting of a value (the probe writes at most 5 levels)
MAX_DIMS = 16  # dimensions of a tensor
MAX_ELEMENTS = 2**22  # elements of one tensor
MAX_TOTAL_ELEMENTS = 2**24  # elements of all a test's tensors together
MAX_INT = 2**63  # larger integers cannot be compared with floats

UNREADABLE = "the result your code left for this test could not be read"


class _Malformed(Exception):
    """What makes an outcome unusable, in words for the student."""


def validated(raw, n_calls: int | None = None) -> list[Outcome] | str:
    """``raw`` as outcomes safe to judge, or a message when it is no list of
    ``n_calls`` outcomes (of at most ``MAX_CALLS`` when ``n_calls`` is None)."""
    if type(raw) is not list:
        return f"{UNREADABLE} (it is not a list of outcomes)"
    if len(raw) > MAX_CALLS or (n_calls is not None and len(raw) != n_calls):
        expected = f"{n_calls}" if n_calls is not None else f"at most {MAX_CALLS}"
        return f"{UNREADABLE} (it holds {len(raw)} outcomes, not {expected})"
    budget = [MAX_TOTAL_ELEMENTS]  # elements the remaining tensors may hold
    return [_outcome(one, budget) for one in raw]


def _outcome(raw, budget: list[int]) -> Outcome:
    """One call's outcome, or an error outcome saying why it cannot be used."""
    try:
        return _checked_outcome(raw, budget)
    except _Malformed as why:
        return {"error": f"{UNREADABLE} ({why})"}
    except Exception as exc:  # noqa: BLE001 (an object no check foresaw: still no crash)
        return {"error": f"{UNREADABLE} ({type(exc).__name__})"}


def _checked_outcome(raw, budget: list[int]) -> Outcome:
    if type(raw) is not dict:
        raise _Malformed("an outcome is not a dict")
    keys = set(raw)
    if keys not in ({"value"}, {"error"}):
        raise _Malformed("an outcome must hold a value or an error, and nothing else")
    if "error" in raw:
        return {"error": _cut(_string(raw["error"]), MAX_ERROR)}
    return {"value": _value(raw["value"], 0, budget)}


def _value(value, depth: int, budget: list[int]):
    """A returned value as the probe writes it: plain data and plain tensors only."""
    if depth > MAX_DEPTH:
        raise _Malformed(f"a value nested deeper than {MAX_DEPTH} levels")
    if value is None or type(value) is bool:
        return value
    # subclasses (a NumPy float) become the plain type, read without their own methods
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, int):
        if abs(int.__int__(value)) > MAX_INT:
            raise _Malformed("an integer too large to compare")
        return int.__int__(value)
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise _Malformed(f"a string longer than {MAX_STRING} characters")
        return str.__str__(value)
    kind = type(value)
    if kind is torch.Tensor:
        return _tensor(value, budget)
    if kind in (list, dict) and len(value) > MAX_ITEMS:
        raise _Malformed(f"a sequence of more than {MAX_ITEMS} items")
    if kind is list:
        return [_value(v, depth + 1, budget) for v in value]
    if kind is dict:
        return {_key(k): _value(v, depth + 1, budget) for k, v in value.items()}
    raise _Malformed(f"a value of type {_cut(kind.__name__, 60)}")


def _key(key) -> str:
    if type(key) is not str or len(key) > MAX_NAME:
        raise _Malformed("a dict key that is not a short string")
    return key


def _tensor(t: torch.Tensor, budget: list[int]) -> torch.Tensor:
    """A plain dense CPU tensor within the size caps, as a fresh compact copy."""
    if t.layout != torch.strided or t.device.type != "cpu" or t.is_nested:
        raise _Malformed("a tensor that is not a plain dense CPU tensor")
    if t.is_quantized or t.dim() > MAX_DIMS:
        raise _Malformed("a tensor of a kind that cannot be compared")
    n = t.numel()
    if n > MAX_ELEMENTS or n > budget[0]:
        raise _Malformed(f"a tensor of {n} elements, more than the grader reads")
    budget[0] -= n
    # a copy: the loaded tensor may be a view of a far larger storage
    return t.detach().clone(memory_format=torch.contiguous_format)


def _string(value) -> str:
    if type(value) is not str:
        raise _Malformed("an error message or name that is not a string")
    return value


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""Read the result files a submission's sealed child wrote, at a cost bounded before
anything is loaded.

The child runs the student's code, so its files are whatever that code made them: this
reader trusts nothing in them. It never unpickles, decompresses or follows a link. One
byte budget holds for all of a submission's result files together
(``Limits.result_mb``): a file is read only if it is a regular file whose size fits in
what is left, so a sparse or oversized file is refused from its size alone, and only the
files of tests that were handed over are looked at. The tensors' entries must lie one
after the other, in order, each referenced once (as the probe writes them), so decoding
makes at most one copy of the file's bytes, and the header it parses is small
(``MAX_HEADER``): the grader's memory for one submission's results stays under about
three times the budget whatever the files hold (``MEMORY_FACTOR``);
``outcomes.validated`` then caps what the judge meets.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import torch

from autograder.grading.judging import outcomes
from autograder.grading.sealed.probe import RESULT_MAGIC

# the bytes read, the tensors decoded from them, and the parsed header: each at most
# the budget (a JSON header of n bytes holds fewer than n values)
MEMORY_FACTOR = 3
# bytes of one file's JSON header: the probe's headers are a few kilobytes (the
# outcomes' plain values and one small entry per tensor); parsed, a header of n bytes
# takes up to about 50 n bytes of Python objects
MAX_HEADER = 256 * 2**10
_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16",
        "int8", "uint8", "bool",
    )
}  # fmt: skip


class Budget:
    """The bytes a submission's result files may still take together."""

    def __init__(self, max_bytes: int):
        self.left = max_bytes
        self.max_bytes = max_bytes


def read_file(path: Path, budget: Budget) -> bytes | str | None:
    """A result file's bytes; None when there is none; a message for the student when it
    is not a plain file or does not fit in what is left of the budget."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{outcomes.UNREADABLE} ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return f"{outcomes.UNREADABLE} (it is not a plain file)"
        if info.st_size > budget.left:
            mb = budget.max_bytes / 2**20
            return f"{outcomes.UNREADABLE} (your results together exceed {mb:g} MB)"
        budget.left -= info.st_size
        chunks, wanted = [], info.st_size
        while wanted > 0:  # never more than the size it had when it was measured
            chunk = os.read(fd, min(wanted, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            wanted -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def decode(raw: bytes) -> list | str:
    """The outcomes a result file holds, validated; a message when it holds none."""
    try:
        return outcomes.validated(_decoded(raw))
    except _Unreadable as why:
        return f"{outcomes.UNREADABLE} ({why})"
    except (ValueError, TypeError, RecursionError, OverflowError, RuntimeError) as exc:
        return f"{outcomes.UNREADABLE} ({type(exc).__name__})"


def decode_request(raw: bytes | str | None) -> dict | str:
    """A stand-in's request (``probe._Oracle``), written as a result file holding one
    dict; a message when it is not one."""
    if not isinstance(raw, bytes):
        return raw or "no request"
    try:
        value = _decoded(raw)
    except _Unreadable as why:
        return f"unreadable request ({why})"
    except (ValueError, TypeError, RecursionError, OverflowError, RuntimeError) as exc:
        return f"unreadable request ({type(exc).__name__})"
    if type(value) is not list or len(value) != 1 or type(value[0]) is not dict:
        return "unreadable request (not the stand-in's)"
    return value[0]


class _Unreadable(Exception):
    pass


def _decoded(raw: bytes):
    if len(raw) < 8 or raw[:4] != RESULT_MAGIC:
        raise _Unreadable("it is not a result the grader's probe writes")
    size = int.from_bytes(raw[4:8], "little")
    if size > MAX_HEADER or 8 + size > len(raw):
        raise _Unreadable("its header is larger than the file or the limit")
    header = json.loads(raw[8 : 8 + size].decode("utf-8"))
    if type(header) is not dict or set(header) != {"outcomes", "tensors"}:
        raise _Unreadable("its header is not the probe's")
    blob = memoryview(raw)[8 + size :]
    tensors, end = [], 0
    for entry in _listed(header["tensors"]):
        tensors.append(_tensor(entry, blob, end))
        end += entry["nbytes"]
    return _filled(header["outcomes"], tensors, 0, set())


def _listed(value) -> list:
    if type(value) is not list:
        raise _Unreadable("its list of tensors is no list")
    return value


def _tensor(entry, blob: memoryview, start: int) -> torch.Tensor:
    """The tensor an entry describes; its bytes must begin where the previous entry's
    end (``start``): entries that overlap or repeat would decode the same bytes again."""
    if type(entry) is not dict or set(entry) != {"dtype", "shape", "offset", "nbytes"}:
        raise _Unreadable("a tensor entry is malformed")
    dtype = _DTYPES.get(entry["dtype"]) if type(entry["dtype"]) is str else None
    shape, offset, nbytes = entry["shape"], entry["offset"], entry["nbytes"]
    if dtype is None:
        raise _Unreadable("a tensor of a type the grader does not compare")
    if type(shape) is not list or len(shape) > outcomes.MAX_DIMS:
        raise _Unreadable("a tensor's shape is malformed")
    if not all(type(n) is int and 0 <= n for n in [*shape, offset, nbytes]):
        raise _Unreadable("a tensor's shape or place is malformed")
    numel = 1
    for n in shape:
        numel *= n
    if numel * dtype.itemsize != nbytes or offset + nbytes > len(blob):
        raise _Unreadable("a tensor's size does not match its bytes")
    if offset != start:
        raise _Unreadable("tensor entries overlap or are out of order")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    data = bytearray(blob[offset : offset + nbytes])  # the one copy
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def _filled(value, tensors: list[torch.Tensor], depth: int, used: set):
    """The outcomes with each ``{"__tensor__": i}`` replaced by its tensor (each tensor
    once: one tensor standing for many values would be judged many times over)."""
    if depth > outcomes.MAX_DEPTH + 2:
        raise _Unreadable("values nested too deep")
    if type(value) is list:
        return [_filled(v, tensors, depth + 1, used) for v in value]
    if type(value) is dict:
        if set(value) == {"__tensor__"}:
            index = value["__tensor__"]
            if type(index) is not int or not 0 <= index < len(tensors):
                raise _Unreadable("a reference to a tensor that is not there")
            if index in used:
                raise _Unreadable("a tensor is referenced twice")
            used.add(index)
            return tensors[index]
        return {k: _filled(v, tensors, depth + 1, used) for k, v in value.items()}
    return value

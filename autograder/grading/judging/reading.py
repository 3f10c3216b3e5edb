"""The student's code read in a process of its own, under a memory and a time limit:
whatever a submission's code is, reading it costs the grader no more than ``BUDGET_MB``.

``read`` forks a child of the grader (it has the course's modules and PyTorch already;
nothing is imported again), which parses the code and works out the flags for review
and each exercise's remark (``delegation``), then sends them back as JSON and exits.
What it cannot read within its limits is flagged for review, never a point: the
remarks are then left out.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import threading
import time
from dataclasses import dataclass, field

from autograder.grading.judging import delegation
from autograder.grading.running.student_code import StudentCode

BUDGET_MB = 256  # the child's address space past the grader's own
SECONDS = 60.0  # the child's time, all of it
UNREAD = "the grader could not read this code within its limits ({}): review it by hand"


@dataclass
class Reading:
    flags: list[str]
    # (exercise, forbidden features) -> the remark on its code ("" for none)
    remarks: dict[tuple[str, tuple[str, ...]], str] = field(default_factory=dict)


def read_in_process(
    code: StudentCode, exercises: list[tuple[str, tuple[str, ...]]], chapter: str
) -> Reading:
    """The reading itself, in this process."""
    flags = delegation.flags(code.cells, exercises, code.given, chapter)
    remarks = {}
    for exercise, forbidden in dict.fromkeys(exercises):
        with delegation.READING_CODE:
            remarks[(exercise, forbidden)] = delegation.remarks(
                code.cells, exercise, forbidden, code.given
            )
    return Reading(flags, remarks)


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def read(
    code: StudentCode, exercises: list[tuple[str, tuple[str, ...]]], chapter: str
) -> Reading:
    """The reading, in a forked child limited to ``BUDGET_MB`` more address space than
    the grader holds and ``SECONDS``; a child that fails is a flag, never a crash."""
    _prepare(code, chapter)
    exercises = list(dict.fromkeys(exercises))
    readable, writable = os.pipe()
    # no other thread reads code while the child is made (their parsers' state is not
    # copied half-way), and the child inherits no lock held
    with delegation.READING_CODE:
        pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(readable)
        delegation.READING_CODE = threading.Lock()  # the copy was taken while held
        status = 0
        try:
            try:
                limit = _address_space() + BUDGET_MB * 2**20
            except OSError:  # no /proc (macOS, where the grader runs without its jail)
                pass
            else:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            signal.alarm(int(SECONDS) + 1)
            found = read_in_process(code, exercises, chapter)
            reply = {"flags": found.flags, "remarks": list(found.remarks.values())}
        except MemoryError:
            reply, status = {"unread": "memory"}, 1
        except BaseException as exc:  # noqa: BLE001 (anything: reported, never raised)
            reply, status = {"unread": type(exc).__name__}, 1
        try:
            data = json.dumps(reply).encode()
            for start in range(0, len(data), 65536):
                os.write(writable, data[start : start + 65536])
        finally:
            os._exit(status)
    os.close(writable)
    try:
        reply = _receive(readable, pid)
    finally:
        os.close(readable)
    if "unread" in reply:
        return Reading([UNREAD.format(reply["unread"])])
    remarks = dict(zip(exercises, reply["remarks"], strict=True))
    return Reading(reply["flags"], remarks)


def _prepare(code: StudentCode, chapter: str) -> None:
    """What the child must not do itself, done once in the grader: read PyTorch's own
    attention (for ``similarity``), import the modules the chapter allows (to tell a
    module from a function), parse the course's cells (the same for every notebook)."""
    from autograder.grading.judging.call_path import namespaces

    delegation._pytorch_attention_shingles()
    for name in namespaces(chapter):
        if not name.endswith(".*"):
            try:
                __import__(name)
            except Exception:  # noqa: BLE001, S110 (not installed: the reader says so)
                pass
    with delegation.READING_CODE:
        for source in code.given:
            delegation._parse(source)


def _receive(readable: int, pid: int) -> dict:
    """The child's reply, or why there is none; the child is reaped either way."""
    chunks, deadline = [], time.monotonic() + SECONDS + 5
    waiting = select.poll()  # not select: descriptors past 1024 in a large batch
    waiting.register(readable, select.POLLIN | select.POLLHUP)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not waiting.poll(int(left * 1000)):
                os.kill(pid, signal.SIGKILL)
                return {"unread": "time"}
            chunk = os.read(readable, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            if sum(map(len, chunks)) > 16 * 2**20:  # the child's reply is bounded too
                os.kill(pid, signal.SIGKILL)
                return {"unread": "reply too large"}
    finally:
        os.waitpid(pid, 0)
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError:
        return {"unread": "no reply"}
    return reply if isinstance(reply, dict) else {"unread": "no reply"}

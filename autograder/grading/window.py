"""The sealed window: the only time a submission's hidden tests exist inside its jail.

After the student's last cell, the grader ends the processes those cells left running,
and the kernel forks one child that seals itself (one thread, no new thread or process,
no exec, no ptrace, no signal to others: ``probe.seal``). From outside the jail the
grader then:

1. finds that child: a child of the kernel with one thread and one more seccomp filter
   than the kernel;
2. stops (SIGSTOP) every other process of the submission, the kernel and all its
   threads included, until none runs: nothing the student left behind (a thread, a
   subprocess, a hook in the kernel) can read the plans or talk to the child;
3. writes the plans into the kernel's folder; the child reads them, runs each test under
   its watch and writes one result file per test;
4. when the child has exited (or is killed past its time), reads the result files into
   memory and deletes them and the plans, and only then lets the others run again.

The plans never exist on disk while a student process runs, and what the child writes is
read before any other student process could change it.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from autograder.grading import probe, result_reader

_POLL = 0.005  # seconds between two looks at the kernel's processes
_SPARE = 64 * 2**20  # free disk below which a missing result may be the grader's fault


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(
                line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line
            )
    except OSError:
        return {}


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (in a PID namespace, every orphan is
    reparented to its init, the kernel: so these are all of the submission's)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[1], []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in "ZX"


def _children(pid: int) -> list[int]:
    """A process's children, from the lists its threads keep (cheap to poll)."""
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return [p for p in descendants(pid) if (_stat(p) or ("", 0))[1] == pid]
    return found


def _filters(status: dict[str, str]) -> tuple[int, int]:
    return int(status.get("Seccomp", "0")), int(status.get("Seccomp_filters", "-1"))


def sealed_children(kernel: int) -> list[int]:
    """The kernel's children that have sealed themselves as the probe does."""
    base_mode, base_filters = _filters(_status(kernel))
    found = []
    for pid in _children(kernel):
        stat, status = _stat(pid), _status(pid)
        if stat is None or stat[1] != kernel or stat[0] in "ZX":
            continue
        mode, filters = _filters(status)
        one_more = filters > base_filters if base_filters >= 0 else base_mode != 2
        if status.get("Threads") == "1" and mode == 2 and one_more:
            found.append(pid)
    return found


def _signal(pid: int, sig: int) -> None:
    """Signal through a pidfd: the number cannot have been reused meanwhile."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


def freeze(kernel: int, keep: int, patience: float = 15.0) -> set[int] | None:
    """Stop every process of the submission but ``keep``; the set stopped, or None if
    they could not all be stopped within ``patience`` seconds (they forked faster than
    they were stopped; a loaded machine may take a while to deliver SIGSTOP)."""
    stopped: set[int] = set()
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        running = []
        for pid in descendants(kernel) - {keep}:
            stat = _stat(pid)
            if stat is None or stat[0] in "tTZX":
                continue
            if pid not in stopped:
                _signal(pid, signal.SIGSTOP)
                stopped.add(pid)
            running.append(pid)
        if not running:
            return stopped
        time.sleep(_POLL)
    thaw(stopped)
    return None


def end_leftovers(kernel: int, rounds: int = 50) -> None:
    """Kill the processes the student's cells left running (the kernel's threads stay):
    they have no part in the tests, and they hold places the tests' process needs."""
    for _ in range(rounds):
        left = {p for p in descendants(kernel) - {kernel} if _alive(p)}
        if not left:
            return
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(_POLL)


def thaw(pids: set[int]) -> None:
    for pid in pids:
        _signal(pid, signal.SIGCONT)


class SealedWindow(threading.Thread):
    """Runs beside nbclient while the kernel executes the probe cell (see the module's
    docstring). ``results`` holds each test's result file as bytes (None where none
    came, a message where it could not be read), ``problem`` says why there were none."""

    def __init__(
        self,
        kernel_pid: Callable[[], int | None],
        folder: Path,
        plans: dict,
        seconds: float,
        wait: float,
        max_bytes: int,
    ):
        super().__init__(daemon=True)
        self.kernel_pid, self.folder, self.plans = kernel_pid, Path(folder), plans
        self.seconds, self.wait, self.max_bytes = seconds, wait, max_bytes
        self.results: list[bytes | str | None] = [None] * len(plans["tests"])
        self.problem: str | None = None
        # the grader's own failure: the notebook gets no grade
        self.fault: str | None = None
        self.child: int | None = None
        self.between: list[str] = []  # watched names seen outside the tests' calls
        # the child ended (a crash, os._exit) before its last test
        self.ended_early = False

    def open(self) -> None:
        """Called before the kernel is sent the probe's cells, so that nothing of the
        grader's is among what is ended: end what the cells left running, then watch."""
        kernel = self.kernel_pid()
        if kernel is not None:
            end_leftovers(kernel)
        self.start()

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 (the grader's own failure: no grade)
            self.fault = f"the grader's window failed ({type(exc).__name__}: {exc})"
        finally:  # the child is never left waiting for plans that will not come
            if self.child is not None:
                _signal(self.child, signal.SIGKILL)

    def _run(self) -> None:
        kernel = self.kernel_pid()
        if kernel is None:
            self.fault = "the grader could not find the kernel's process"
            return
        child = self.child = self._await_child(kernel)
        if child is None:
            return
        frozen = freeze(kernel, keep=child)
        if frozen is None:
            _signal(child, signal.SIGKILL)
            self.problem = "the notebook's processes could not be stopped for the tests"
            return
        try:
            others = [p for p in sealed_children(kernel) if p != child]
            if others:  # a second sealed child: not the grader's doing
                self.problem = (
                    "another process posed as the grader's test process; no test ran"
                )
                _signal(child, signal.SIGKILL)
                return
            self._hand_over(child)
            self._collect()
        finally:
            thaw(frozen)

    def _await_child(self, kernel: int) -> int | None:
        deadline = time.monotonic() + self.wait
        unsealed = self.folder / "unsealed"
        while time.monotonic() < deadline:
            if _stat(kernel) is None:
                self.problem = "the kernel ended before the hidden tests ran"
                return None
            children = sealed_children(kernel)
            if children:
                return children[0]
            if unsealed.exists():
                why = unsealed.read_text(errors="replace")[:300]
                self.problem = f"the tests' process could not seal itself ({why})"
                return None
            time.sleep(_POLL)
        self.problem = "the hidden tests never started (the kernel did not run them)"
        return None

    def _hand_over(self, child: int) -> None:
        """Write the plans for ``child`` and wait for it to finish (killed past its
        time: each test's limit, and a little more)."""
        for stale in self.folder.glob("result_*"):  # left by the cells: no test ran yet
            stale.unlink(missing_ok=True)
        partial = self.folder / (probe.PLANS + ".part")
        torch.save(self.plans, partial)
        partial.rename(self.folder / probe.PLANS)
        limit = self.seconds * len(self.plans["tests"]) + 10
        try:
            fd = os.pidfd_open(child)
        except OSError:
            return  # already gone
        try:
            # poll, not select: a grader with many files open has descriptors past 1024
            waiting = select.poll()
            waiting.register(fd, select.POLLIN)
            if not waiting.poll(limit * 1000):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                waiting.poll(10_000)
            else:
                last = self.folder / probe.result_name(len(self.results) - 1)
                self.ended_early = not last.exists()
        finally:
            os.close(fd)

    def _collect(self) -> None:
        """Read each result file (all of them together at most ``max_bytes``), then delete what the window
        wrote or received: nothing stays for the thawed processes to read or change."""
        budget = result_reader.Budget(self.max_bytes)  # all the tests' files together
        for i in range(len(self.results)):
            self.results[i] = result_reader.read_file(
                self.folder / probe.result_name(i), budget
            )
        free = os.statvfs(self.folder)
        if None in self.results and free.f_bavail * free.f_frsize < _SPARE:
            self.fault = f"the disk that holds {self.folder.parent} is full"
        try:
            with open(self.folder / probe.BETWEEN, errors="replace") as f:
                self.between = f.read(20000).split()
        except OSError:
            pass
        for path in self.folder.iterdir():
            name = path.name
            if name.startswith(("result_", probe.PLANS, probe.BETWEEN, "unsealed")):
                path.unlink(missing_ok=True)

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
3. writes the plans of the tests that allow PyTorch's attention into the kernel's folder;
   the child reads them, runs each test and writes one result file per test;
4. waits until the child has armed the attention guard (``grading/sealed/guard``): two seccomp
   filters more than the kernel, and the guard's library mapped, as /proc shows from
   outside; only then writes the plans of the tests that forbid PyTorch's attention. The
   child proves first that the guard refuses (``probe.PROOF``); if it never arms, or the
   proof fails, those tests are not graded and neither is the notebook (``fault``);
5. when the child has exited (or is killed past its time), reads the result files into
   memory and deletes them and the plans, and only then lets the others run again.

A test of a later exercise also runs a second time, with the earlier exercises it uses
played by the course's stand-ins (``probe.REFERENCE_PLAN``, ``judging/upstream.py``). In
each phase these runs come after the phase's own tests, one at a time: the grader reads
(and so fixes) every result before it, then hands over the run's plan, answers the
stand-ins' requests for that run's exercises only, computing the reference itself, and
reads the run's result before the next. An answer can therefore change no result but the
run it was asked for, whatever the child writes or claims.

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
from typing import Any

import torch

from autograder.grading.judging.upstream import TooLarge
from autograder.grading.sealed import guard, probe, result_reader

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
        guard: str | Path | None = None,
        oracle: Callable[[dict], Any] | None = None,
        settled: Callable[[int], bool] | None = None,
    ):
        super().__init__(daemon=True)
        self.kernel_pid, self.folder, self.plans = kernel_pid, Path(folder), plans
        self.guard = None if guard is None else Path(guard)
        self.seconds, self.wait, self.max_bytes = seconds, wait, max_bytes
        self.results: list[bytes | str | None] = [None] * len(plans["tests"])
        self.budget = result_reader.Budget(max_bytes)  # all the tests' files together
        self.read: set[int] = set()  # results read (and fixed) before the child ended
        # computes what a stand-in asks (``upstream.ReferenceServer``)
        self.oracle = oracle
        # whether a run with stand-ins (its index) is not needed: its test passed with
        # the student's own code, whose result is read by then
        self.settled = settled
        self.problem: str | None = None
        # the grader's own failure: the notebook gets no grade
        self.fault: str | None = None
        self.child: int | None = None
        self.kernel_filters = -1  # the kernel's seccomp filters, before the child's
        self.proof: str | None = None  # what the child's proof said, if it was asked
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
        self.kernel_filters = _filters(_status(kernel))[1]
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
            self._check_proof()
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

    def _phase(self, guarded: bool) -> dict:
        """The phase's own tests, and the indices of its runs with stand-ins."""
        own, references = [], []
        for i, t in enumerate(self.plans["tests"]):
            if bool(t.get("guarded")) == guarded:
                (references if t.get("oracle") else own).append(i)
        return {
            "tests": [self.plans["tests"][i] for i in own],
            "indices": own,
            "references": references,
            "seconds": self.plans["seconds"],
        }

    def _done(self, index: int) -> bool:
        return index in self.read or (self.folder / probe.result_name(index)).exists()

    def _read(self, indices: list[int]) -> None:
        """Read these tests' results now (each once): what the child writes later for
        them is never looked at."""
        for i in indices:
            if i not in self.read:
                path = self.folder / probe.result_name(i)
                self.results[i] = result_reader.read_file(path, self.budget)
                path.unlink(missing_ok=True)
                self.read.add(i)

    def _write(self, name: str, plans: dict) -> None:
        partial = self.folder / (name + ".part")
        torch.save(plans, partial)
        partial.rename(self.folder / name)

    def _hand_over(self, child: int) -> None:
        """Write the plans for ``child`` in two phases and wait for it to finish (killed
        past its time: each test's limit, and a little more)."""
        first, second = self._phase(False), self._phase(True)
        first["guarded"] = len(second["indices"]) + len(second["references"])
        for stale in self.folder.glob("result_*"):  # left by the cells: no test ran yet
            stale.unlink(missing_ok=True)
        for stale in (probe.PROOF, probe.UNARMED, probe.GUARDED_PLANS):
            (self.folder / stale).unlink(missing_ok=True)
        try:
            fd = os.pidfd_open(child)
        except OSError:
            return  # already gone
        try:
            self._write(probe.PLANS, first)
            runs = _StandInRuns(self, first)
            last = None
            if first["guarded"]:
                limit = self.seconds * runs.count + 10
                armed = self._armed(child, fd, limit, runs)
                done_first = not runs.count or self._done(runs.last)
                if armed is None and not done_first:
                    # it ended inside a first-phase test: the student's code (os._exit,
                    # a crash) costs the tests left, as anywhere in the window
                    self.ended_early = True
                    return
                if not armed:  # ended or stalled between the phases, where it arms
                    self.fault = self.fault or self._unarmed_why(child)
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    return
                self._read(runs.all)  # fixed before any answer of the second phase
                runs = _StandInRuns(self, second)
                for i in runs.all:  # none may come from the first phase
                    (self.folder / probe.result_name(i)).unlink(missing_ok=True)
                self._write(probe.GUARDED_PLANS, second)
            if runs.count:
                last = runs.last
            limit = self.seconds * runs.count + 10
            # poll, not select: a grader with many files open has descriptors past 1024
            waiting = select.poll()
            waiting.register(fd, select.POLLIN)
            deadline, exited = time.monotonic() + limit, False
            while time.monotonic() < deadline:
                if waiting.poll(int(_POLL * 1000)):
                    exited = True
                    break
                runs.step()
            if not exited:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                waiting.poll(10_000)
            elif last is not None:
                self.ended_early = not self._done(last)
            if first["guarded"]:
                try:
                    self.proof = (self.folder / probe.PROOF).read_text(
                        errors="replace"
                    )[:100]
                except OSError:
                    self.proof = "no proof written"
        finally:
            os.close(fd)

    def _armed(
        self, child: int, fd: int, limit: float, runs: _StandInRuns
    ) -> bool | None:
        """Wait (at most ``limit`` seconds) until the child, seen from outside, has armed
        the guard: two seccomp filters more than the kernel, the guard mapped. None if it
        exits first without having said why it could not arm (``_hand_over`` tells a
        death inside a first-phase test, the student's doing, from one where it arms);
        False if it runs out of time or says it could not arm."""
        deadline = time.monotonic() + limit
        waiting = select.poll()
        waiting.register(fd, select.POLLIN)
        while time.monotonic() < deadline:
            status = _status(child)
            if not status or waiting.poll(0):  # it has exited
                return False if (self.folder / probe.UNARMED).exists() else None
            mode, filters = _filters(status)
            if (
                mode == 2
                and self.kernel_filters >= 0
                and filters >= self.kernel_filters + 2
                and status.get("Threads") == "1"
            ):
                return self.guard is None or guard.mapped(child, self.guard)
            runs.step()
            time.sleep(_POLL)
        return False

    def _unarmed_why(self, child: int) -> str:
        try:
            why = (self.folder / probe.UNARMED).read_text(errors="replace")[:300]
        except OSError:
            why = ""
        if why:
            return (
                "the tests that forbid PyTorch's attention could not switch it off "
                f"({why}); they were not run and the notebook is not graded"
            )
        if (
            self.guard is not None
            and _status(child)
            and not guard.mapped(child, self.guard)
        ):
            return (
                "the attention guard was not loaded in the tests' process; the tests "
                "that forbid PyTorch's attention were not run and the notebook is not graded"
            )
        return (
            "the tests' process did not switch PyTorch's attention off before the tests "
            "that forbid it (it ended or stopped first); they were not run and the "
            "notebook is not graded"
        )

    def _check_proof(self) -> None:
        """The child's own first call in the second phase: PyTorch's attention must have
        been refused by the guard; otherwise nothing of the phase counts."""
        proof = self.proof
        if proof is None:
            return
        if proof.strip() != "refused":
            self.fault = self.fault or (
                "the attention guard did not refuse PyTorch's attention in the tests' "
                f"process ({proof.strip() or 'nothing'}); the tests that forbid it do not "
                "count and the notebook is not graded"
            )
            second = self._phase(True)
            for i in second["indices"] + second["references"]:
                self.results[i] = None

    def _collect(self) -> None:
        """Read each result file (all of them together at most ``max_bytes``), then delete what the window
        wrote or received: nothing stays for the thawed processes to read or change."""
        self._read([i for i in range(len(self.results)) if i not in self.read])
        free = os.statvfs(self.folder)
        if None in self.results and free.f_bavail * free.f_frsize < _SPARE:
            self.fault = f"the disk that holds {self.folder.parent} is full"
        for path in self.folder.iterdir():
            name = path.name
            if name.startswith(
                (
                    "result_",
                    probe.PLANS,
                    probe.GUARDED_PLANS,
                    probe.PROOF,
                    probe.UNARMED,
                    "unsealed",
                    "reference_plan_",
                    "oracle_",
                    "ready_",
                )
            ):
                path.unlink(missing_ok=True)


class _StandInRuns:
    """A phase's runs with the course's stand-ins, handed over one at a time once every
    result before them has been read (``step`` is called while the window waits)."""

    def __init__(self, window: SealedWindow, phase: dict):
        self.window, self.own, self.pending = (
            window,
            phase["indices"],
            phase["references"],
        )
        self.all = self.own + self.pending
        self.count, self.last = len(self.all), self.all[-1] if self.all else None
        self.out: int | None = None  # the run handed over, whose result is awaited

    def step(self) -> None:
        window = self.window
        if self.out is None:
            if not self.pending:
                return
            # every result before it is in, or the child waits for the run (a result it
            # never wrote is then lost, as anywhere in the window)
            ready = window.folder / probe.READY.format(self.pending[0])
            if not (ready.exists() or all(window._done(i) for i in self.own)):
                return
            window._read(self.own)
            self.out = self.pending.pop(0)
            for stale in window.folder.glob("oracle_*"):
                stale.unlink(missing_ok=True)
            if window.settled is not None and window.settled(self.out):
                # its result stays None: nothing the child writes for it is read
                window._write(probe.REFERENCE_PLAN.format(self.out), probe.SKIP_PLAN)
                window.read.add(self.out)
                self.own, self.out = [*self.own, self.out], None
                return
            plan = window.plans["tests"][self.out]
            window._write(probe.REFERENCE_PLAN.format(self.out), plan)
            return
        self._answer_requests()
        if window._done(self.out):
            window._read([self.out])
            self.own = [*self.own, self.out]
            self.out = None

    def _answer_requests(self) -> None:
        window = self.window
        allowed = window.plans["tests"][self.out]["oracle"]
        prefix = f"oracle_{self.out}_"
        for path in sorted(window.folder.glob(prefix + "*.req")):
            number = path.name[len(prefix) : -len(".req")]
            raw = result_reader.read_file(path, result_reader.Budget(window.max_bytes))
            path.unlink(missing_ok=True)
            reply = _answer(window.oracle, raw, allowed)
            partial = window.folder / f"{prefix}{number}.rep.part"
            torch.save(reply, partial)
            partial.rename(
                window.folder / probe.ORACLE_REPLY.format(f"{self.out}_{number}")
            )


def _answer(oracle, raw, allowed: dict) -> dict:
    """The reply to one stand-in's request: ``{"value": ...}`` or ``{"error": ...}``.
    The request is the student's: what it names must be this run's, and its sizes those
    of the test (``within``), so that the reference's cost stays that of a test."""
    request = result_reader.decode_request(raw)
    if isinstance(request, str):
        return {"refused": request}
    name, kind = request.get("name"), request.get("kind")
    kinds = {"call": allowed["functions"], "init": allowed["modules"]}
    kinds["forward"] = kinds["method"] = allowed["modules"]
    if oracle is None or type(name) is not str or type(kind) is not str:
        return {"refused": "no stand-in for that here"}
    if name not in kinds.get(kind, ()):
        return {"refused": "no stand-in for that here"}
    parts = [request.get(k) for k in ("args", "kwargs", "init")]
    if not within(parts, *allowed["largest"]):
        return {"refused": "larger than anything this test passes: not computed"}
    try:
        return {"value": oracle(request, allowed["largest"])}
    except TooLarge as exc:
        return {"refused": str(exc)}
    except Exception as exc:  # noqa: BLE001 (the course's code on the student's inputs)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


SIZE_FACTOR = 4  # how much larger than the test's own a stand-in's argument may be
INTEGERS = 8192  # an integer argument may be this large whatever the test (a max_len)


def within(value, side: int, numel: int, depth: int = 0) -> bool:
    """Every tensor no longer in any dimension than ``SIZE_FACTOR`` times ``side``
    and no larger than that times ``numel``; every integer (a width, a length, a count of
    layers) no larger than that times ``side`` or ``INTEGERS``; nothing nested deeper
    than a plan. The reference's output is bounded too (``upstream.TooLarge``)."""
    if depth > 8:
        return False
    if isinstance(value, torch.Tensor):
        return (
            all(n <= SIZE_FACTOR * side for n in value.shape)
            and value.numel() <= SIZE_FACTOR * numel
        )
    if isinstance(value, bool) or value is None or isinstance(value, float | str):
        return True
    if isinstance(value, int):
        return abs(value) <= max(SIZE_FACTOR * side, INTEGERS)
    if isinstance(value, list | tuple):
        return all(within(v, side, numel, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(within(v, side, numel, depth + 1) for v in value.values())
    return False

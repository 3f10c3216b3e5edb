"""A jailed kernel as jupyter_client sees its process: one connection to the sandbox's
zygote, held in the grader's own process (no process of its own to start for each kernel).

It answers what jupyter_client asks of a ``subprocess.Popen``: ``poll``, ``wait``,
``send_signal``, ``terminate``, ``kill``. The zygote's child that serves the kernel
relays ``I`` (SIGINT: an interrupt) and kills the kernel, with everything it started, on
``K`` (any other signal) or when this connection closes: when the grader ends, however it
ends, so do its kernels. When the kernel has ended, the child sends one line of JSON, how
it ended (exit code, signal, who killed it, memory): ``report``."""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import threading
import time

LOST = {"exit_code": None, "signal": None, "lost": True}


class ZygoteKernel:
    stdin = stdout = stderr = None  # jupyter_client closes these when set
    pid = None  # the kernel's own number is its sandbox's to tell (``kernel_pid``)

    def __init__(self, socket_path: str, request: dict):
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(socket_path)
        self._conn.sendall(json.dumps(request).encode() + b"\n")
        self._reading = threading.Lock()  # one reader at a time
        self._sending = threading.Lock()  # no send beside the close
        self._closed = False
        self._reply = b""
        self.report: dict | None = None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once the kernel has ended (minus the signal that ended it, as
        ``Popen`` says it); None while it runs or while another thread is reading."""
        if self._reading.acquire(blocking=False):
            try:
                self._read(0)
            finally:
                self._reading.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._reading:
            if not self._read(timeout):
                raise subprocess.TimeoutExpired("jailed kernel", timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        with self._sending:
            if self._closed:
                return
            try:
                self._conn.sendall(b"I" if signum == signal.SIGINT else b"K")
            except OSError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def abandon(self) -> None:
        """Close the connection without a report (the zygote's child did not answer):
        its end of it kills the kernel, if it still can."""
        with self._reading:
            if self.report is None:
                self._finish(b"")

    def _read(self, timeout: float | None) -> bool:
        """Read what the zygote's child sent within ``timeout`` seconds (None: until it
        reports); True once the report is in."""
        if self.report is not None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        # poll, not select: a grader with many files open has descriptors past 1024
        waiting = select.poll()
        waiting.register(self._conn, select.POLLIN)
        while self.report is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not waiting.poll(None if left is None else int(left * 1000)):
                return False
            try:
                chunk = self._conn.recv(4096)
            except OSError:
                chunk = b""
            self._reply += chunk
            if not chunk or self._reply.endswith(b"\n"):
                self._finish(self._reply)
        return True

    def _finish(self, reply: bytes) -> None:
        try:
            report = json.loads(reply)
            if not isinstance(report, dict):
                raise ValueError
        except ValueError:  # the zygote's child died before it could report
            report = dict(LOST)
        with self._sending:
            self._closed = True
            self._conn.close()
        if report.get("signal"):
            self.returncode = -report["signal"]
        else:
            self.returncode = report.get("exit_code") or (
                1 if report.get("lost") else 0
            )
        self.report = report

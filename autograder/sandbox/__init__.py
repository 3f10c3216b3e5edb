"""Where student code runs: a jail built from Linux namespaces, started warm.

Guarantee (Linux with unprivileged user namespaces, as on Debian, Ubuntu and Fedora):
a student's kernel sees a root filesystem made only of the system's read-only directories
(``/usr``, a few files of ``/etc``), the read-only Python installation and its packages, an
empty 256 MB ``/submission`` (its working directory, ``HOME``) and ``/tmp``, and its own
kernel directory (ZeroMQ sockets and the probe's plan and result files). The course
repository (``solutions/``, the hidden tests, the instructor notebooks, the gradebook),
other students' submissions and kernels, and the rest of the disk are not in that root.
It has no network (an empty network namespace), sees only its own processes (a PID
namespace: they all die with the kernel), cannot unmount or remount what it was given
(the mounts are locked by a further user namespace), and runs under memory, file-size and
time limits. It runs with the grader's own uid outside the namespaces: files it could
reach would be written as that user, which is why it reaches none but its own.

What it does not promise: protection against kernel exploits, or against a student using
their time limit to burn CPU. Where user namespaces are disabled, grading refuses to run
unless ``--no-sandbox`` is given (then student code runs as the grader's user with only a
scrubbed environment: acceptable for your own tests, not for untrusted submissions).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

from autograder.limits import Limits
from autograder.paths import REPO

_HERE = Path(__file__).parent
_SYSTEM = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/os-release",
    "/etc/matplotlibrc",
)


class SandboxUnavailable(RuntimeError):
    pass


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _python_paths() -> list[str]:
    """The interpreter and every package directory, resolved; none inside the course."""
    prefixes = {
        os.path.realpath(p)
        for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    }
    candidates = set(prefixes) | {
        os.path.realpath(p)
        for p in [*sys.path, *site.getsitepackages(), site.getusersitepackages()]
        if p and os.path.isdir(p)
    }
    repo = str(REPO)
    return sorted(
        p
        for p in candidates
        if not _inside(p, repo) or any(_inside(p, q) for q in prefixes)
    )


class Sandbox:
    """One warm zygote per batch; ``kernel()`` gives a fresh jailed kernel per submission."""

    def __init__(
        self,
        limits: Limits | None = None,
        hide: list[Path] = (),
        ready_timeout: float = 120.0,
    ):
        self.limits = limits or Limits()
        self.base = Path(tempfile.mkdtemp(prefix="course-sandbox-"))
        self.base.chmod(0o700)
        (self.base / "kernels").mkdir()
        self.socket = str(self.base / "zygote.sock")
        python = _python_paths()
        config = {
            "base": str(self.base),
            "expose": [*_SYSTEM, *python],
            "hide": [str(REPO), *map(str, hide), *self.limits.hide],
            "path": [
                os.path.join(p, "bin")
                for p in python
                if p.endswith(("/usr", sys.prefix))
            ]
            + ["/usr/local/bin", "/usr/bin", "/bin"],
            "memory": self.limits.memory_mb * 2**20,
            "disk": self.limits.disk,
            "file_size": self.limits.file_mb * 2**20,
            "threads": self.limits.threads,
        }
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["MPLBACKEND"] = "Agg"
        self.process = subprocess.Popen(
            [sys.executable, str(_HERE / "zygote.py"), self.socket, json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.base,
            env=env,
            start_new_session=True,
        )
        ready, _, _ = select.select([self.process.stdout], [], [], ready_timeout)
        line = self.process.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.close()
            why = self.process.stderr.read().decode(errors="replace").strip()
            raise SandboxUnavailable(
                "could not start the grading sandbox (Linux user namespaces are needed): "
                + (why.splitlines()[-1] if why else "no answer")
            )

    @contextmanager
    def kernel(self) -> Iterator[tuple[AsyncKernelManager, Path]]:
        """A kernel manager whose kernel runs jailed, and the kernel's directory."""
        kernel_dir = Path(tempfile.mkdtemp(dir=self.base / "kernels"))
        request = {
            "kernel_dir": str(kernel_dir),
            "connection_file": str(kernel_dir / "kernel.json"),
        }
        command = [
            sys.executable,
            "-I",
            "-S",
            str(_HERE / "launcher.py"),
            self.socket,
            json.dumps(request),
        ]
        km = _LaunchedKernelManager(
            command,
            transport="ipc",
            ip=str(kernel_dir / "ipc"),
            connection_file=request["connection_file"],
        )
        try:
            yield km, kernel_dir
        finally:
            stop_kernel(km)
            shutil.rmtree(kernel_dir, ignore_errors=True)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def kill_kernel(km: AsyncKernelManager) -> None:
    """SIGKILL the kernel's process group at once (safe from any thread). In the sandbox
    that is the launcher, whose death takes the kernel and all it started with it."""
    process = getattr(getattr(km, "provisioner", None), "process", None)
    if process is not None and process.poll() is None:
        try:
            group = os.getpgid(process.pid)
            if group == os.getpgid(0):  # never the grader's own group
                raise ProcessLookupError
            os.killpg(group, signal.SIGKILL)
        except OSError:
            process.kill()
        process.wait()


def stop_kernel(km: AsyncKernelManager) -> None:
    """nbclient leaves a kernel it did not start running: end it and free its files."""
    kill_kernel(km)
    try:
        run_sync(km.cleanup_resources)()
    except Exception:  # noqa: BLE001 (best effort: the files live in a folder we delete)
        pass


class _LaunchedKernelManager(AsyncKernelManager):
    """Starts ``command`` (the launcher) instead of the kernelspec's command."""

    def __init__(self, command: list[str], **kwargs):
        super().__init__(kernel_name="python3", **kwargs)
        self._command = command

    def format_kernel_cmd(self, extra_arguments=None) -> list[str]:
        return list(self._command)


class Unsandboxed:
    """``--no-sandbox``: a plain local kernel with a scrubbed environment (trusted code only)."""

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()

    @contextmanager
    def kernel(self) -> Iterator[tuple[AsyncKernelManager, Path]]:
        with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
            km = AsyncKernelManager(kernel_name="python3")
            try:
                yield km, Path(tmp)
            finally:
                stop_kernel(km)

    def close(self) -> None:
        pass

    def __enter__(self) -> Unsandboxed:
        return self

    def __exit__(self, *exc) -> None:
        pass

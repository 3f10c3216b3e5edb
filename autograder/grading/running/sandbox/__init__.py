"""Where student code runs: a jail built from Linux namespaces, started warm.

Guarantee (Linux with unprivileged user namespaces, as on Debian, Ubuntu and Fedora):
a student's kernel sees a root filesystem made only of the system's read-only directories
(``/usr``, a few files of ``/etc``), the read-only Python installation and its packages,
an empty ``/submission`` (its working directory, ``HOME``), ``/tmp`` and ``/dev/shm``
(private tmpfs mounts of ``Limits.disk`` each) and its own kernel directory (ZeroMQ
sockets and the probe's plan and result files, on the grader's disk). The course
repository (``solutions/``, the hidden tests, the instructor notebooks, the gradebook),
other students' submissions and kernels, and the rest of the disk are not in that root.

Each kernel has namespaces of its own: PID (it sees only its own processes, which all
die with it), IPC (its SysV segments and message queues end with it and are seen by no
other kernel), network (only its loopback, up: it may serve on 127.0.0.1 to itself, but
reaches nothing outside, and no abstract unix socket or port of another kernel) and
hostname. It cannot unmount or remount what it was given (the mounts are locked by a
further user namespace, or by dropping to an unprivileged uid).

It runs under memory, disk, file-size and time limits. ``Limits.memory_mb`` holds for all
the memory it holds in any form, measured from outside the jail every
``Limits.watch_period`` seconds (``Watch`` in ``zygote.py``): its processes' anonymous
and file-backed memory, shared memory they map, files in its tmpfs mounts, its SysV
segments and its memfd files, each counted once; the reported peak includes all of it
(summed exactly at least once a second and whenever its resident pages grow by 64 MB;
a sum of resident pages, never below it, decides between those).
Past the limit the largest process is killed, a forked child before the kernel, and the
kernel itself when shared memory (which no other death frees) is past it. What it writes
to its kernel directory is capped at ``Limits.kernel_dir_mb`` (and 4096 files, checked
at the same pace; past it the kernel is killed), and the directory is deleted when the
kernel ends, along with its processes, tmpfs mounts and IPC namespace: nothing it made
survives it. The number of its processes (RLIMIT_NPROC, counted per kernel) and, per
process, its address space and file sizes are limited too. Between two samples a kernel
may overshoot a limit by what it can allocate or write in that time. Run by an ordinary
user, it has that user's uid outside the namespaces: files it could reach would be
written as that user, which is why it reaches none but its own. Run by root, each kernel
runs as an unprivileged uid of its own (``Limits.kernel_uid`` onwards), outside the
namespaces too.

What it does not promise: protection against kernel exploits, against a student using
their time limit to burn CPU (their processes all end with their kernel), or a count of
the memory the Linux kernel holds on a kernel's behalf (socket and pipe buffers, page
tables, POSIX message queues, which RLIMIT_MSGQUEUE caps). Where the jail
cannot start, ``diagnose.py`` says why and how to fix it, and nothing is graded unless
``--no-sandbox`` is given (then student code runs as the grader's user with only a
scrubbed environment: acceptable for your own tests, not for untrusted submissions).
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

from autograder.grading.running.limits import Limits
from autograder.grading.running.sandbox import zygote
from autograder.grading.running.sandbox.kernel_link import ZygoteKernel
from autograder.grading.running.sandbox.ready import ReadyClient
from autograder.grading.sealed import guard
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


# What a kernel imports: the folders holding them are exposed even when they lie outside
# the Python installation's own folders (a PYTHONPATH entry, an editable install).
_KERNEL_PACKAGES = (
    "torch",
    "numpy",
    "matplotlib",
    "ipykernel",
    "IPython",
    "jupyter_client",
    "jupyter_core",
    "zmq",
    "traitlets",
    "tqdm",
)


def _python_paths() -> list[str]:
    """The interpreter's installation and the package folders kernels import from,
    resolved: a venv or conda prefix, site-packages, the user's site-packages, wherever
    they lie. Not the current folder or other ``sys.path`` entries (they may be a home
    folder), and nothing inside the course but a venv made there."""
    prefixes = {
        os.path.realpath(p)
        for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    }
    sites = {
        os.path.realpath(p)
        for p in [*site.getsitepackages(), site.getusersitepackages()]
        if p and os.path.isdir(p)
    }
    entries = [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]
    roots = prefixes | sites
    chosen = set(roots) | {p for p in entries if any(_inside(p, r) for r in roots)}
    for name in _KERNEL_PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = os.path.realpath(spec.origin) if spec and spec.origin else None
        if origin:
            chosen |= {p for p in entries if _inside(origin, p)}
    repo = str(REPO)
    return sorted(
        p
        for p in chosen
        if not _inside(p, repo) or any(_inside(p, q) for q in prefixes)
    )


def _mapped(map_file: str, first: int, count: int) -> bool:
    """Whether ids ``first`` .. ``first + count - 1`` exist in this user namespace."""
    with open(map_file) as f:
        for line in f:
            inside, _, length = map(int, line.split())
            if inside <= first and first + count <= inside + length:
                return True
    return False


def kernel_ids(first: int, count: int = 65536) -> tuple[int, int] | None:
    """For a grader running as root: the unprivileged ids its kernels run as (one each,
    in turn). ``first`` where this user namespace has them (a container's root may have
    only 65536 ids), else the upper half of its ids. None for an ordinary user."""
    if os.getuid() != 0:
        return None
    while count >= 16:
        for start in (first, 65536 - count - 2):  # below nobody (65534) otherwise
            if start > 0 and all(
                _mapped(f"/proc/self/{m}", start, count) for m in ("uid_map", "gid_map")
            ):
                return start, count
        count //= 2
    raise SandboxUnavailable(
        "running as root in a user namespace with too few user ids to run student "
        "kernels as an unprivileged user"
    )


@dataclass
class KernelEnd:
    """How a jailed kernel ended, as the zygote saw it (``ZygoteKernel.report``)."""

    exit_code: int | None = None
    signal: int | None = None
    # "grader" (a limit, the end of grading), "memory", or "disk" (it wrote more than
    # ``Limits.kernel_dir_mb`` to its kernel directory)
    killed_by: str | None = None
    peak_mb: float | None = None  # the most it held together, in any form
    killed_for_memory_mb: list[float] = field(default_factory=list)
    lost: bool = False  # no report: the zygote's child was killed, or did not answer
    log: str = ""  # the kernel's own output before IPython took over, and the zygote's

    @property
    def killed_from_outside(self) -> bool:
        """Ended by something outside the submission: the host's out-of-memory killer,
        an administrator's kill. A kernel is PID 1 of its namespace, so no process of
        the submission can send it SIGKILL, SIGTERM or SIGHUP."""
        if self.lost:
            return True
        outside = (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP)
        return self.signal in outside and self.killed_by is None

    def log_tail(self, lines: int = 3) -> str:
        kept = [line for line in self.log.strip().splitlines() if line.strip()]
        return " | ".join(kept[-lines:])


# address space a kernel adds to the zygote's as it starts (ipykernel's threads and
# first cells), with room for a small cell. Measured with torch 2.13 and triton on x86-64:
# a 940 MB zygote's kernels start under a 1100 MB limit, not under 1000 MB.
KERNEL_HEADROOM_MB = 256


class Sandbox:
    """One warm zygote per batch; ``kernel()`` gives a fresh jailed kernel per submission."""

    def __init__(
        self,
        limits: Limits | None = None,
        hide: list[Path] = (),
        ready_timeout: float = 120.0,
        wait: bool = True,
    ):
        """Start the jail's warm process; with ``wait``, wait until it is ready (else
        call :meth:`ready` before the first kernel: the process preloads PyTorch
        meanwhile, for a few seconds of one core)."""
        self.created = time.perf_counter()
        self.limits = limits or Limits()
        self._ready_timeout, self._started = ready_timeout, False
        # the attention guard, built before the jail: without it nothing is graded
        try:
            self.guard = str(guard.ensure())
        except guard.GuardUnavailable as exc:
            raise SandboxUnavailable(str(exc)) from None
        self.base = Path(tempfile.mkdtemp(prefix="course-sandbox-"))
        self.base.chmod(0o700)
        (self.base / "kernels").mkdir()
        (self.base / "status").mkdir()
        self.socket = str(self.base / "zygote.sock")
        python = _python_paths()
        self.kernel_ids = kernel_ids(self.limits.kernel_uid)
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
            "kernel_dir": self.limits.kernel_dir_mb * 2**20,
            "processes": self.limits.processes,
            "threads": self.limits.threads,
            "kernel_ids": self.kernel_ids,
            "watch_period": self.limits.watch_period,
            "guard": self.guard,
        }
        # settled here, before the warm process imports anything: never the grader's own
        env = zygote.warm_environment(config, os.environ)
        self.process = subprocess.Popen(
            [sys.executable, str(_HERE / "zygote.py"), self.socket, json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.base,
            env=env,
            start_new_session=True,
        )
        if wait:
            self.ready()

    @classmethod
    def for_notebooks(cls, paths, limits: Limits) -> Sandbox:
        """The jail for grading ``paths`` (their folders hidden from the kernels), its
        warm process started and not waited for: it preloads PyTorch on one core while
        the grader loads its tests on another."""
        folders = sorted({Path(p).resolve().parent for p in paths})
        return cls(limits, hide=folders, wait=False)

    def ready(self) -> None:
        """Wait until the warm process has preloaded; raises ``SandboxUnavailable``
        (after closing it) if it cannot start. Once ready, returns at once."""
        if self._started:
            return
        ready, _, _ = select.select([self.process.stdout], [], [], self._ready_timeout)
        line = self.process.stdout.readline() if ready else b""
        if line.split()[:1] != [b"ready"]:
            self.close()
            why = self.process.stderr.read().decode(errors="replace").strip()
            guarded = [x for x in why.splitlines() if x.startswith("attention guard:")]
            if guarded:
                raise SandboxUnavailable(
                    f"The {guarded[-1][:500]}. Nothing was graded and no grade was "
                    "recorded: the hidden tests need PyTorch's attention switched off."
                )
            from autograder.grading.running.sandbox.diagnose import explain

            raise SandboxUnavailable(
                explain(why.splitlines()[-1] if why else "the zygote did not answer")
            )
        self._check_memory_limit(int(line.split()[1]) // 1024)
        self._started = True

    def _check_memory_limit(self, start_mb: int) -> None:
        """A limit under what a kernel needs to start would fail every kernel, the
        canary's first, with a message about a broken machine: say what it is instead."""
        needed = start_mb + KERNEL_HEADROOM_MB
        if self.limits.memory_mb < needed:
            self.close()
            raise SandboxUnavailable(
                f"The memory limit ({self.limits.memory_mb} MB, --memory-mb) is below "
                f"what a kernel needs to start on this machine: PyTorch and what it "
                f"imports take {start_mb} MB of address space before any cell runs. "
                f"Nothing was graded and no grade was recorded; use --memory-mb "
                f"{-(-needed // 256) * 256} or more (the default is "
                f"{Limits().memory_mb})."
            )

    @contextmanager
    def kernel(self) -> Iterator[tuple[AsyncKernelManager, Path]]:
        """A kernel manager whose kernel runs jailed, and the kernel's directory."""
        kernel_dir = Path(tempfile.mkdtemp(dir=self.base / "kernels"))
        request = {
            "kernel_dir": str(kernel_dir),
            "connection_file": str(kernel_dir / "kernel.json"),
            "pid_file": str(self._pid_file(kernel_dir)),
        }
        km = _JailedKernelManager(
            self.socket,
            request,
            transport="ipc",
            ip=str(kernel_dir / "ipc"),
            connection_file=request["connection_file"],
        )
        km.kernel_pid = lambda: _read_pid(self._pid_file(kernel_dir))
        try:
            yield km, kernel_dir
        finally:
            stop_kernel(km)
            remove_tree(kernel_dir)
            self._pid_file(kernel_dir).unlink(missing_ok=True)

    def _pid_file(self, kernel_dir: Path) -> Path:
        """Where the zygote notes the kernel's process id (outside the jail)."""
        return self.base / "status" / f"{kernel_dir.name}.pid"

    def end(self, km: AsyncKernelManager, kernel_dir: Path) -> KernelEnd:
        """Stop the kernel (if it still runs) and say how it ended."""
        stop_kernel(km)
        end = KernelEnd(lost=True)
        report = km.jailed.report if km.jailed is not None else None
        try:
            end = KernelEnd(**{k: v for k, v in report.items() if k != "log"})
        except (AttributeError, TypeError):
            pass
        if self.process.poll() is not None:
            end.lost = True
            end.log = "the sandbox's zygote process has died"
        for name in ("kernel.log", "sandbox.log"):
            try:
                with open(kernel_dir / name, errors="replace") as f:
                    end.log += f.read()[-4000:]
            except OSError:
                pass
        return end

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        remove_tree(self.base)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def remove_tree(path: Path) -> None:
    """Delete a folder a kernel wrote to, whatever it did there: folders it made
    unreadable (``chmod 0``, which stops an ordinary user's ``rmtree``) are opened up
    first; symlinks are removed, never followed. Called once its kernel has ended."""
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass
    for folder, subfolders, _ in os.walk(path):  # top-down: opened before it is read
        for name in subfolders:
            inner = os.path.join(folder, name)
            if not os.path.islink(inner):
                try:
                    os.chmod(inner, 0o700)
                except OSError:
                    pass
    shutil.rmtree(path, ignore_errors=True)


def _kernel_process(km: AsyncKernelManager):
    """What jupyter_client holds as the kernel's process: the jail's ``ZygoteKernel``,
    or a plain local kernel's ``Popen``; None once it has been waited for."""
    jailed = getattr(km, "jailed", None)
    if jailed is not None:
        return jailed
    return getattr(getattr(km, "provisioner", None), "process", None)


def kill_kernel(km: AsyncKernelManager, grace: float = 5.0) -> None:
    """End the kernel and all it started (safe from any thread). It is asked first
    (SIGTERM: in the jail, the zygote's child kills it and reports how it ended); past
    ``grace`` seconds a jailed kernel's connection is closed, which kills it too, and a
    plain local kernel's process group gets SIGKILL."""
    process = _kernel_process(km)
    if process is None or process.poll() is not None:
        return
    try:
        process.terminate()
        process.wait(grace)
        return
    except (OSError, subprocess.TimeoutExpired):
        pass
    if isinstance(process, ZygoteKernel):
        process.abandon()
        return
    try:
        group = _kernel_group(process)
        if group is None:
            raise ProcessLookupError
        os.killpg(group, signal.SIGKILL)
    except OSError:
        process.kill()
    process.wait()


def _kernel_group(process) -> int | None:
    """A plain local kernel's process group; None if it is the grader's own (never
    signalled). OSError once the kernel is gone."""
    group = os.getpgid(process.pid)
    return None if group == os.getpgid(0) else group


def interrupt_kernel(km: AsyncKernelManager) -> None:
    """SIGINT the kernel (safe from any thread): relayed by the zygote's child in the
    jail, sent to a plain local kernel's process group."""
    process = _kernel_process(km)
    if isinstance(process, ZygoteKernel):
        process.send_signal(signal.SIGINT)
        return
    if process is not None:
        try:
            group = _kernel_group(process)
            if group is not None:
                os.killpg(group, signal.SIGINT)
        except OSError:
            pass


def stop_kernel(km: AsyncKernelManager) -> None:
    """nbclient leaves a kernel it did not start running: end it and free its files."""
    kill_kernel(km)
    try:
        run_sync(km.cleanup_resources)()
    except Exception:  # noqa: BLE001 (best effort: the files live in a folder we delete)
        pass


class _JailedKernelManager(AsyncKernelManager):
    """Asks the sandbox's zygote for the kernel instead of starting the kernelspec's
    command: its process, for jupyter_client, is a ``ZygoteKernel`` (``jailed``)."""

    def __init__(self, socket_path: str, request: dict, **kwargs):
        super().__init__(kernel_name="python3", client_factory=ReadyClient, **kwargs)
        self._socket_path, self._request = socket_path, request
        self.jailed: ZygoteKernel | None = None

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        # the provisioner has written the connection file the kernel reads
        self.jailed = ZygoteKernel(self._socket_path, self._request)
        self.provisioner.process = self.jailed
        self._reconcile_connection_info(self.provisioner.connection_info)


class Unsandboxed:
    """``--no-sandbox``: a plain local kernel with a scrubbed environment (trusted code only)."""

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()
        try:  # loaded by the probe in the kernel (``probe._load_guard``)
            self.guard = str(guard.ensure())
        except guard.GuardUnavailable as exc:
            raise SandboxUnavailable(str(exc)) from None

    def ready(self) -> None:
        pass

    @contextmanager
    def kernel(self) -> Iterator[tuple[AsyncKernelManager, Path]]:
        with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
            km = AsyncKernelManager(kernel_name="python3", client_factory=ReadyClient)
            try:
                yield km, Path(tmp)
            finally:
                stop_kernel(km)

    def end(self, km: AsyncKernelManager, kernel_dir: Path) -> KernelEnd:
        """Without the jail nothing tells who ended the kernel: never a retry."""
        stop_kernel(km)
        return KernelEnd()

    def close(self) -> None:
        pass

    def __enter__(self) -> Unsandboxed:
        return self

    def __exit__(self, *exc) -> None:
        pass

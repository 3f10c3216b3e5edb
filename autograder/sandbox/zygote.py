"""The sandbox's warm process: imports PyTorch once, then forks one jailed kernel per request.

Run as a script by the grader (``python zygote.py SOCKET CONFIG_JSON``), never imported by
student code. It needs only the standard library plus what kernels preload, so nothing of
the course is imported here. Steps:

1. Enter a new user namespace (mapped to the grader's own uid) and an empty network
   namespace: no network for anything forked from here.
2. Import PyTorch, NumPy, Matplotlib and ipykernel once (the expensive part of a kernel).
3. For each request on SOCKET, fork. The child enters new mount and PID namespaces and forks
   the kernel, which becomes PID 1 there (when it exits, every process the student started
   dies with it). The kernel builds a new root of read-only system and Python directories,
   its own kernel directory (read-write, for ZeroMQ's sockets and the probe's files) and
   small private tmpfs folders, pivots into it, drops the old root, locks those mounts by
   entering one more user namespace, applies resource limits, scrubs the environment and
   starts an IPython kernel. The course repository, other submissions, the gradebook and
   the rest of the disk are not in its root at all.
4. The child relays the launcher's signals to the kernel and reports the kernel's exit.
"""

import ctypes
import json
import os
import platform
import resource
import select
import signal
import socket
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUTS = 0x04000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    """SIGKILL this process when its parent dies: nothing outlives the grader."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _unshare(flags, what):
    _check(_libc.unshare(flags), f"unshare ({what})")


def _mount(source, target, fstype, flags, data=None):
    enc = [
        None if s is None else str(s).encode() for s in (source, target, fstype, data)
    ]
    _check(
        _libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]),
        f"mount {target}",
    )


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def enter_user_and_net_namespace():
    uid, gid = os.getuid(), os.getgid()
    _unshare(
        CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS, "user, network"
    )
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def _locked_flags(path):
    """The flags a read-only remount must keep (a user namespace may not drop them)."""
    f = os.statvfs(path).f_flag
    flags = 0
    for st, ms in (
        (2, MS_NOSUID),
        (4, MS_NODEV),
        (8, MS_NOEXEC),
        (1024, MS_NOATIME),
        (2048, MS_NODIRATIME),
        (4096, MS_RELATIME),
    ):
        if f & st:
            flags |= ms
    return flags


def _bind(source, root, writable=False):
    """Make ``source`` appear at the same path inside ``root``; symlinks are copied."""
    target = root + source
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(source):
        if not os.path.lexists(target):
            os.symlink(os.readlink(source), target)
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        open(target, "w").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    if not writable:
        _mount(
            None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _locked_flags(target)
        )


def _tmpfs(target, size, mode="1777"):
    os.makedirs(target, exist_ok=True)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode}")


def build_root(root, config, kernel_dir):
    """Mount the kernel's whole visible filesystem under ``root``."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _tmpfs(root, "16m", mode="755")
    for path in config["expose"]:
        if os.path.lexists(path):
            _bind(path, root)
    for path in config["hide"]:  # hidden paths that happen to lie inside an exposed one
        if os.path.isdir(root + path):
            _mount(
                "tmpfs",
                root + path,
                "tmpfs",
                MS_RDONLY | MS_NOSUID | MS_NODEV,
                "size=4k",
            )
    os.makedirs(root + "/dev", exist_ok=True)
    for device in ("null", "zero", "full", "random", "urandom"):
        _bind("/dev/" + device, root, writable=True)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{root}/dev/{name}")
    _tmpfs(root + "/dev/shm", config["disk"])
    _tmpfs(root + "/tmp", config["disk"])
    _tmpfs(root + "/submission", config["disk"], mode="777")
    _bind(kernel_dir, root, writable=True)  # last: it may lie under /tmp
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # Pivot into the new root and detach the old one: nothing outside stays reachable.
    os.chdir(root)
    number = SYS_PIVOT_ROOT[platform.machine()]
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # A mount namespace owned by a new user namespace: every mount above becomes locked,
    # so the student's code cannot unmount, remount writable, or reveal what lies beneath.
    _unshare(CLONE_NEWUSER | CLONE_NEWNS, "lock mounts")


def apply_limits(config):
    for name, value in (
        ("RLIMIT_AS", config["memory"]),
        ("RLIMIT_FSIZE", config["file_size"]),
        ("RLIMIT_CORE", 0),
    ):
        if value:
            resource.setrlimit(getattr(resource, name), (value, value))


def kernel_environment(config):
    return {
        "PATH": os.pathsep.join(config["path"]),
        "HOME": "/submission",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "MPLBACKEND": "Agg",  # figures are not graded: plt.show() draws nothing
        "MPLCONFIGDIR": "/tmp/.matplotlib",
        "IPYTHONDIR": "/tmp/.ipython",
        "OMP_NUM_THREADS": str(config["threads"]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def run_kernel(request, config):
    """In the kernel process (PID 1 of its namespace): jail, limit, start IPython."""
    import tempfile

    root = tempfile.mkdtemp(prefix="root-", dir=config["base"])
    build_root(root, config, request["kernel_dir"])
    os.environ.clear()
    os.environ.update(kernel_environment(config))
    os.chdir("/submission")
    sys.path[:] = [p for p in sys.path if p and os.path.isdir(p)]
    import torch

    torch.set_num_threads(config["threads"])
    apply_limits(config)
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(
        [
            "-f",
            request["connection_file"],
            "--HistoryManager.enabled=False",
            "--log-level=ERROR",
        ]
    )
    app.start()


def serve_one(conn, request, config):
    """In the forked child: new mount and PID namespaces, then the kernel as PID 1."""
    die_with_parent()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this process waits for its kernel
    _unshare(CLONE_NEWNS | CLONE_NEWPID, "mount, pid")
    kernel = os.fork()
    if kernel == 0:
        die_with_parent()
        conn.close()
        # the kernel's own stderr (before IPython captures it): read by the grader on failure
        log = os.open(
            os.path.join(request["kernel_dir"], "kernel.log"),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
            0o600,
        )
        os.dup2(log, 2)
        os.dup2(log, 1)
        code = 0
        try:
            run_kernel(request, config)
        except BaseException as exc:  # noqa: BLE001 (report why the kernel could not start)
            import traceback

            traceback.print_exc()
            print(
                f"sandbox: the kernel could not start: {exc!r}",
                file=sys.stderr,
                flush=True,
            )
            code = 70
        os._exit(code)

    # No threads here: a process that unshared its PID namespace may not create any.
    pidfd = os.pidfd_open(kernel)
    while True:
        readable, _, _ = select.select([conn, pidfd], [], [])
        if pidfd in readable:
            break
        try:
            data = conn.recv(16)
        except OSError:
            data = b""
        if not data:  # the launcher is gone: so is the kernel, and all it started
            _kill(kernel, signal.SIGKILL)
            continue
        for byte in data:
            _kill(kernel, signal.SIGINT if byte == ord("I") else signal.SIGKILL)
    _, status = os.waitpid(kernel, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        conn.sendall(f"{code}\n".encode())
    except OSError:
        pass
    os._exit(0)


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def preload():
    """What every kernel would import: done once here, shared by every fork."""
    import matplotlib

    matplotlib.use("Agg")
    import ipykernel.ipkernel  # noqa: F401
    import ipykernel.kernelapp  # noqa: F401
    import IPython  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401

    # the probe's watch on PyTorch calls: its first use imports torch._dynamo (seconds)
    import torch._dynamo  # noqa: F401
    import torch.nn.functional  # noqa: F401
    import torch.overrides  # noqa: F401
    import torch.utils._python_dispatch  # noqa: F401

    try:
        import tqdm.auto  # noqa: F401
    except ImportError:
        pass


def main(socket_path, config_json):
    config = json.loads(config_json)
    die_with_parent()
    enter_user_and_net_namespace()
    preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(64)
    # stdout is the grader's pipe: "ready" says the preload is done; then it is closed.
    devnull = os.open(os.devnull, os.O_RDWR)
    print("ready", flush=True)
    os.dup2(devnull, 1)
    os.dup2(devnull, 0)
    while True:
        conn, _ = server.accept()
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            line += chunk
        try:
            request = json.loads(line)
        except ValueError:
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            try:
                serve_one(conn, request, config)
            except BaseException:  # noqa: BLE001 (the kernel's log says why)
                import traceback

                with open(
                    os.path.join(request["kernel_dir"], "sandbox.log"), "a"
                ) as log:
                    traceback.print_exc(file=log)
            finally:
                os._exit(71)
        conn.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

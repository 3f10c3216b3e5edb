"""The sandbox's warm process: imports PyTorch once, then forks one jailed kernel per request.

Run as a script by the grader (``python zygote.py SOCKET CONFIG_JSON``), never imported by
student code. It needs only the standard library plus what kernels preload, so nothing of
the course is imported here. Steps:

1. Enter a new user namespace (mapped to the grader's own uid) and an empty network
   namespace: no network for anything forked from here.
2. Import PyTorch, NumPy, Matplotlib and ipykernel once (the expensive part of a kernel),
   and fold that memory into 2 MB pages, which makes each fork and each kernel's end cheap.
3. For each request on SOCKET, fork. The child enters new mount, PID, IPC, network (only
   its own loopback, up) and hostname namespaces and forks the kernel, which becomes PID 1
   there (when it exits, every process the student started
   dies with it). The kernel builds a new root of read-only system and Python directories,
   its own kernel directory (read-write, for ZeroMQ's sockets and the probe's files) and
   small private tmpfs folders, pivots into it, drops the old root, locks those mounts by
   entering one more user namespace, applies resource limits, scrubs the environment and
   starts an IPython kernel. The course repository, other submissions, the gradebook and
   the rest of the disk are not in its root at all.
4. The child relays the grader's signals to the kernel, watches the memory its kernel
   holds in any form and what it writes to its kernel directory, and reports the kernel's
   exit. The kernel's end frees its IPC namespace and tmpfs mounts with it.
"""

import ctypes
import fcntl
import gc
import json
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
import time

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
PR_SET_DUMPABLE = 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
SHM_INFO = 14

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


def enter_namespaces(config):
    """A new user namespace (plus empty network, IPC and hostname namespaces) for the
    zygote; each kernel gets IPC, network and hostname namespaces of its own on top
    (``isolate``). An ordinary user maps only itself (as root inside);
    root maps itself and the range of unprivileged ids its kernels will run as. A map of
    more than one's own id must be written from outside the new namespace: by a child
    forked before it, which still has root's rights."""
    uid, gid = os.getuid(), os.getgid()
    first, count = config["kernel_ids"] or (None, 0)
    flags = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if first is None:
        _unshare(flags, "user, network, IPC and hostname")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
        return
    me, (go_r, go_w), (done_r, done_w) = os.getpid(), os.pipe(), os.pipe()
    writer = os.fork()
    if writer == 0:
        die_with_parent()
        os.close(go_w)
        if not os.read(go_r, 1):  # the parent could not unshare: nothing to map
            os._exit(0)
        try:
            _write(f"/proc/{me}/uid_map", f"0 {uid} 1\n{first} {first} {count}")
            _write(f"/proc/{me}/gid_map", f"0 {gid} 1\n{first} {first} {count}")
            os.write(done_w, b"y")
        except OSError as exc:
            os.write(done_w, str(exc).encode()[:200])
        os._exit(0)
    os.close(go_r)
    try:
        _unshare(flags, "user, network, IPC and hostname")
    finally:
        os.write(go_w, b"g")
        os.close(go_w)
    answer = os.read(done_r, 256)
    os.waitpid(writer, 0)
    if answer != b"y":
        raise OSError(f"writing the user namespace's id maps: {answer.decode()}")


def _locked_flags(path):
    """The flags a read-only remount must keep (a user namespace may not drop them)."""
    f = os.statvfs(path).f_flag
    flags = 0
    for st, ms in (
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
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


def _tmpfs(target, size, mode="1777", flags=MS_NOSUID | MS_NODEV):
    os.makedirs(target, exist_ok=True)
    _mount("tmpfs", target, "tmpfs", flags, f"size={size},mode={mode}")


# What the kernel may write it may not run: no program, library or Python extension
# written during grading loads (``torch.compile`` builds none: ``eager_compiles``).
WRITABLE = MS_NOSUID | MS_NODEV | MS_NOEXEC


def _under(path, parent):
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def build_root(root, config, kernel_dir):
    """Mount the kernel's whole visible filesystem under ``root``. The private tmpfs
    folders come first and the exposed paths after them, so a Python installation that
    lies under ``/tmp`` (a venv made there) is mounted over the private ``/tmp``, not
    hidden by it."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _tmpfs(root, "16m", mode="755")
    _tmpfs(root + "/tmp", config["disk"], flags=WRITABLE)
    _tmpfs(root + "/dev/shm", config["disk"], flags=WRITABLE)
    _tmpfs(root + "/submission", config["disk"], mode="777", flags=WRITABLE)
    exposed = sorted(p for p in config["expose"] if os.path.lexists(p))
    for path in exposed:  # sorted: a folder before what lies inside it
        _bind(path, root)
    # A hidden path inside an exposed folder (a course kept under /opt, say) is covered
    # with an empty read-only tmpfs; exposed paths inside it (the course's own .venv)
    # are mounted again on top.
    for hidden in config["hide"]:
        inside = any(_under(hidden, p) and hidden != p for p in exposed)
        if inside and os.path.isdir(root + hidden):
            _tmpfs(root + hidden, "64k", mode="755")
            for path in exposed:
                if _under(path, hidden):
                    _bind(path, root)
            _mount(
                None, root + hidden, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
            )
    for device in ("null", "zero", "full", "random", "urandom"):
        _bind("/dev/" + device, root, writable=True)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{root}/dev/{name}")
    _bind(kernel_dir, root, writable=True)  # last: it lies under /tmp
    target = root + kernel_dir
    _mount(None, target, None, MS_REMOUNT | MS_BIND | WRITABLE | _locked_flags(target))
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # Pivot into the new root and detach the old one: nothing outside stays reachable.
    os.chdir(root)
    number = SYS_PIVOT_ROOT[platform.machine()]
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def lock_mounts():
    """A mount namespace owned by a new user namespace: every mount becomes locked, so
    the student's code cannot unmount, remount writable, or reveal what lies beneath."""
    _unshare(CLONE_NEWUSER | CLONE_NEWNS, "lock mounts")


def drop_to(uid, kernel_dir):
    """Root's kernels run as an unprivileged id, also outside the namespaces. A process
    without capabilities can neither unmount nor remount, so the mounts stay as built."""
    for folder, _, files in os.walk(kernel_dir):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(name, uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    # setuid made the kernel undumpable, which would hide its memory map (smaps) from the
    # zygote's watch; its own uid is its alone, so no other process gains access
    _libc.prctl(PR_SET_DUMPABLE, 1)
    # and cleared its parent-death signal: without it, a kernel whose supervisor is
    # killed from outside would run on, orphaned
    die_with_parent()


def apply_limits(config):
    for name, value in (
        ("RLIMIT_AS", config["memory"]),  # per process; the watch below sums them
        ("RLIMIT_FSIZE", config["file_size"]),
        (
            "RLIMIT_NPROC",
            config["processes"],
        ),  # per user and user namespace: per kernel
        ("RLIMIT_CORE", 0),
    ):
        if value is not None:
            resource.setrlimit(getattr(resource, name), (value, value))


def kernel_environment(config):
    """The environment a kernel runs with, and (with ``warm_environment``'s places) the
    one the warm process starts with: what a package reads once, as it is imported
    (Triton's interpreter switch, the thread count), is settled before the preload, so
    every kernel forked from it sees what it is documented to see, whatever the grader's
    own environment held."""
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
        # the hidden tests pass CPU tensors: Triton kernels run in its interpreter
        "TRITON_INTERPRET": "1",
    }


# Where the warm process, which runs outside the jail, finds the grader's machine: its
# home (user site-packages, caches), temporary folder and library path. Nothing else of
# the grader's environment reaches it.
_PLACES = (
    "HOME",
    "TMPDIR",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "MPLCONFIGDIR",
    "PYTHONUSERBASE",
    "LD_LIBRARY_PATH",
)


def warm_environment(config, grader_environment):
    """The warm process's environment: the kernel's (``kernel_environment``), with the
    grader's places (``_PLACES``) where the kernel's name places inside the jail."""
    env = kernel_environment(config)
    for name in ("HOME", "TMPDIR", "MPLCONFIGDIR", "IPYTHONDIR"):
        del env[name]  # places inside the jail, which the warm process is not in
    env.update({k: v for k, v in grader_environment.items() if k in _PLACES})
    # glibc reserves 64 MB of address space per malloc arena and adds arenas under
    # contention (a loaded machine): kernels forked from here would drift towards
    # RLIMIT_AS and fail with MemoryError through no fault of the submission
    env["MALLOC_ARENA_MAX"] = "2"
    return env


def run_kernel(request, config):
    """In the kernel process (PID 1 of its namespace): jail, limit, start IPython."""
    import tempfile

    os.umask(
        0o022
    )  # the folders made for the new root must be traversable by the kernel
    root = tempfile.mkdtemp(prefix="root-", dir=config["base"])
    build_root(root, config, request["kernel_dir"])
    if request.get("uid") is None:
        lock_mounts()
    else:
        drop_to(request["uid"], request["kernel_dir"])
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
            # the grader keeps an error's name and message, never its traceback, which
            # IPython's default mode takes a tenth of a second to format
            "--InteractiveShell.xmode=Minimal",
        ]
    )
    app.start()


def _start_kernel(request, config):
    """In the kernel process: stdout and stderr to the kernel log (the grader reads it
    when a kernel fails to start), then ``run_kernel``; never returns."""
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
            f"sandbox: the kernel could not start: {exc!r}", file=sys.stderr, flush=True
        )
        code = 70
    os._exit(code)


_PAGE = os.sysconf("SC_PAGE_SIZE")
_SMALL = 2**20  # shared memory a process maps below this is counted twice, not sought
_TMPFS = (
    "/tmp",
    "/dev/shm",
    "/submission",
)  # the jail's writable, memory-backed places


class _ShmInfo(ctypes.Structure):
    _fields_ = [
        ("used_ids", ctypes.c_int),
        ("shm_tot", ctypes.c_ulong),
        ("shm_rss", ctypes.c_ulong),
        ("shm_swp", ctypes.c_ulong),
        ("swap_attempts", ctypes.c_ulong),
        ("swap_successes", ctypes.c_ulong),
    ]


def _shm_device():
    """The device of the kernel's internal shmem mount, where memfd files, SysV segments
    and shared anonymous memory live (learnt from a memfd of our own)."""
    fd = os.memfd_create("probe")
    try:
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


def _rollup(pid):
    """A process's smaps_rollup as {field: bytes}; empty where it cannot be read."""
    fields = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                name, _, rest = line.partition(b":")
                if rest.strip().endswith(b"kB"):
                    fields[name.decode()] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return fields


def _statm(pid):
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _unlisted_shmem(pid, shm_dev, counted):
    """Bytes of the internal shmem a process maps that nothing else counts: shared
    anonymous memory, a memfd whose descriptor was closed. Its SysV segments and the
    open files in ``counted`` are counted once elsewhere; tmpfs files have their own
    device."""
    total, take = 0, False
    try:
        with open(f"/proc/{pid}/smaps", "rb") as f:
            for line in f:
                head = line.split(None, 5)
                if b"-" in head[0] and len(head) >= 5:  # a mapping's first line
                    major, minor = (int(x, 16) for x in head[3].split(b":"))
                    path = head[5] if len(head) > 5 else b""
                    take = (
                        os.makedev(major, minor) == shm_dev
                        and not path.startswith(b"/SYSV")
                        and (shm_dev, int(head[4])) not in counted
                    )
                elif take and head[0] == b"Pss:":
                    total += int(head[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total


def _memory_of(pid, shm_dev, counted):
    """Bytes a process holds: its proportional share (pages shared with the zygote or
    with its own forks count once in all) of anonymous and file-backed memory, plus the
    shared memory it maps that is not counted elsewhere. Without the split (old kernels):
    its whole Pss, or its resident size."""
    fields = _rollup(pid)
    if "Pss_Anon" not in fields:
        return fields.get("Pss") or _statm(pid)
    shmem = fields.get("Pss_Shmem", 0)
    if shmem >= _SMALL:
        shmem = _unlisted_shmem(pid, shm_dev, counted)
    return fields["Pss_Anon"] + fields.get("Pss_File", 0) + shmem


def _tmpfs_used():
    """Bytes in the jail's tmpfs mounts, open, deleted or mapped (this process shares
    the kernel's pivoted root)."""
    seen, used = set(), 0
    for path in _TMPFS:
        try:
            if os.stat(path).st_dev in seen:
                continue
            seen.add(os.stat(path).st_dev)
            st = os.statvfs(path)
        except OSError:
            continue
        used += (st.f_blocks - st.f_bfree) * st.f_frsize
    return used


def _sysv_shm():
    """Bytes of the SysV shared memory segments of this IPC namespace (the kernel's),
    attached or not."""
    info = _ShmInfo()
    if _libc.shmctl(0, SHM_INFO, ctypes.byref(info)) < 0:
        return 0
    return (info.shm_rss + info.shm_swp) * _PAGE


def _open_files(pids):
    """{(device, inode): (link, size)} of the memfd and deleted files the processes hold
    open: memory or disk that no path leads to."""
    found = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                link = os.readlink(path)
                if "memfd:" not in link and not link.endswith(" (deleted)"):
                    continue
                st = os.stat(path)
            except OSError:
                continue
            found[st.st_dev, st.st_ino] = (link, st.st_blocks * 512)
    return found


class Watch:
    """All the memory the submission holds, summed every ``period`` seconds (sooner as
    it nears the limit: ``_next_wait``): its
    processes' own memory, its tmpfs files, its SysV segments (this process is in the
    kernel's IPC namespace) and its memfd files, each counted once. Past the limit the
    largest process is killed (a forked child before the kernel), until the rest fit;
    the kernel at once when shared memory alone (which no other death frees) is past it.
    The kernel mounted ``/proc`` for its own PID namespace and pivoted this process's
    root too, so ``/proc`` here lists exactly its processes and ``/tmp`` is its own.

    Each sample first sums the processes' resident pages (``statm``, a counter read),
    which is never below their exact share (``_memory_of``, which walks every page
    table: the costly part). The exact sum is taken when that bound is past the limit,
    so the limit holds exactly as if it were taken every time; and, for the peak,
    whenever the bound has grown by ``EXACT_GROWTH`` since the last exact sum, and at
    least every ``EXACT_EVERY`` seconds."""

    EXACT_GROWTH = 64 * 2**20
    EXACT_EVERY = 1.0
    SOONEST = 0.005  # seconds: the shortest wait between two samples

    def __init__(self, limit, period=0.2):
        self.limit, self.period = limit, period
        self.peak = 0
        self.killed = []  # (pid, bytes) of the processes killed for memory
        self.shm_dev = _shm_device()
        self.open = {}  # the last sample's open files (``Scratch`` reads them too)
        self._exact_bound = None  # the bound when the exact sum was last taken
        self._exact_when = 0.0
        self._last = None  # (time, bound) of the last sample
        self._processes = 0  # what the processes held at the last exact sum
        self.wait = period  # seconds until the next sample (``_next_wait``)

    def _next_wait(self, now, bound):
        """Sooner than ``period`` while the memory grows towards the limit: a quarter of
        the time the growth since the last sample would take to reach it (never under
        ``SOONEST``). A notebook that allocates fast is sampled every few hundredths of
        a second as it nears the limit, so what it adds between the sample that finds it
        past the limit and the one before stays small, whatever the machine's load (its
        allocation gets the same share of the CPU as this process)."""
        last, self._last = self._last, (now, bound)
        self.wait = self.period
        if last is None or bound <= last[1] or now <= last[0]:
            return
        rate = (bound - last[1]) / (now - last[0])
        ahead = max(self.limit - bound, 0) / rate
        self.wait = min(self.period, max(self.SOONEST, ahead / 4))

    def sample(self):
        if os.path.exists("/proc/self"):
            return  # the host's /proc: the kernel has not mounted its own yet
        shared = _tmpfs_used() + _sysv_shm()
        if shared > self.limit:  # no process's death frees it: the kernel at once
            self._kill_kernel(shared)
            return
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
        self.open = _open_files(pids)
        memfds = {k: v for k, v in self.open.items() if k[0] == self.shm_dev}
        shared += sum(b for _, b in memfds.values())
        if shared > self.limit:
            self._kill_kernel(shared)
            return
        bound = sum(_statm(pid) for pid in pids) + shared
        now = time.monotonic()
        self._next_wait(now, bound)
        if (
            bound <= self.limit
            and self._exact_bound is not None
            and bound < self._exact_bound + self.EXACT_GROWTH
            and now < self._exact_when + self.EXACT_EVERY
        ):
            return
        self._exact_bound, self._exact_when = bound, now
        sizes = {pid: _memory_of(pid, self.shm_dev, memfds) for pid in pids}
        self._processes = sum(sizes.values())
        total = self._processes + shared
        self.peak = max(self.peak, total)
        while total > self.limit and sizes:
            # the kernel (PID 1 in its namespace) last: a forked child goes first
            pid = max(sizes, key=lambda p: (p != "1", sizes[p]))
            _kill_listed(pid)
            self.killed.append((pid, total if pid == "1" else sizes[pid]))
            if pid == "1":
                return
            total -= sizes.pop(pid)

    def _kill_kernel(self, held):
        """The kernel, and so every process of the submission: its end frees its IPC
        namespace and tmpfs mounts, and the memfd files its processes hold. ``held``:
        its shared memory; its processes' as at the last exact sum."""
        held += self._processes
        self.peak = max(self.peak, held)
        _kill_listed("1")
        if not (self.killed and self.killed[-1][0] == "1"):  # once, not at each sample
            self.killed.append(("1", held))


class Scratch:
    """What the kernel wrote to its kernel directory (on the grader's disk, writable
    because ZeroMQ's sockets live there): its files, and those it deleted but holds
    open. Past ``limit`` bytes or ``entries`` files, ``over`` says so."""

    def __init__(self, kernel_dir, limit, entries=4096):
        self.kernel_dir, self.limit, self.entries = kernel_dir, limit, entries

    def over(self, open_files):
        deleted = sum(
            size
            for link, size in open_files.values()
            if link.startswith(self.kernel_dir + "/")
        )
        size, count = _tree_size(self.kernel_dir, self.entries)
        return size + deleted > self.limit or count > self.entries


def _tree_size(folder, most):
    """(bytes, entries) under ``folder``, symlinks not followed; stops past ``most``."""
    size, count, todo = 0, 0, [folder]
    while todo and count <= most:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    count += 1
                    st = entry.stat(follow_symlinks=False)
                    size += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
        except OSError:
            pass
    return size, count


def _kill_listed(pid):
    """SIGKILL a process listed in the kernel's /proc. Its number there is not its number
    here, so it is signalled through a descriptor of its /proc folder, never by number."""
    try:
        fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def loopback_up():
    """Bring up ``lo`` of this network namespace: a kernel may serve on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh22x", b"lo", 0)
        (_, flags) = struct.unpack("16sh22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def isolate():
    """This kernel's own namespaces: mount and PID (its processes), IPC (its SysV
    segments and message queues, which end with it), network (only its loopback: no
    abstract unix socket or port of another kernel is reachable) and hostname."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS
    _unshare(flags, "mount, pid, IPC, network and hostname")
    loopback_up()


MARGIN = 256 * 2**20  # what a kernel may hold past its limit before it is stopped


def cap_sysv_shm(limit):
    """The kernel's SysV segments together (its IPC namespace's ``shmall``, and each
    one's ``shmmax``) capped at the memory limit plus ``MARGIN``: past it ``shmget``
    fails (ENOSPC) and no segment, attached or not, can hold more, whenever the watch
    runs (which stops the kernel at the limit itself, and says why). Best effort: a
    kernel that refuses the write leaves the watch alone to bound them."""
    cap = limit + MARGIN
    for name, value in (("shmmax", cap), ("shmall", -(-cap // _PAGE))):
        try:
            with open(f"/proc/sys/kernel/{name}", "w") as f:
                f.write(str(value))
        except OSError:
            pass


def serve_one(conn, request, config):
    """In the forked child: the kernel's own namespaces, then the kernel as PID 1. Here
    the kernel's signals are relayed, the memory it holds and what it writes to its
    kernel directory watched, and how it ended reported to the grader as one line of
    JSON."""
    die_with_parent()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this process waits for its kernel
    # for the grader's sealed window: opened now, since the kernel's pivot into its new
    # root will take this process's view of the grader's folders away too
    pid_file = os.open(
        request["pid_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
    )
    isolate()
    if config["memory"]:
        cap_sysv_shm(config["memory"])  # this IPC namespace is the kernel's
    kernel = os.fork()
    if kernel == 0:
        die_with_parent()
        conn.close()
        os.close(pid_file)
        _start_kernel(request, config)

    # No threads here: a process that unshared its PID namespace may not create any.
    pidfd = os.pidfd_open(kernel)
    os.write(pid_file, str(kernel).encode())
    os.close(pid_file)
    watch = (
        Watch(config["memory"], config["watch_period"]) if config["memory"] else None
    )
    scratch = Scratch(request["kernel_dir"], config["kernel_dir"])
    killed_by = None  # who among us ended the kernel, if anyone did
    while True:
        wait = watch.wait if watch is not None else config["watch_period"]
        readable, _, _ = select.select([conn, pidfd], [], [], wait)
        if pidfd in readable:
            break
        if watch is not None:
            try:
                watch.sample()
            except OSError:
                pass
            if watch.killed and watch.killed[-1][0] == "1":
                killed_by = killed_by or "memory"
        if killed_by is None and scratch.over(watch.open if watch else {}):
            killed_by = "disk"
            _kill(kernel, signal.SIGKILL)
            _note(
                request,
                f"the kernel wrote more than {scratch.limit // 2**20} MB "
                f"or {scratch.entries} files to its kernel directory: killed",
            )
        if conn not in readable:
            continue
        try:
            data = conn.recv(16)
        except OSError:
            data = b""
        if not data:  # the grader is gone: so is the kernel, and all it started
            killed_by = killed_by or "grader"
            _kill(kernel, signal.SIGKILL)
            continue
        for byte in data:
            if byte != ord("I"):
                killed_by = killed_by or "grader"
            _kill(kernel, signal.SIGINT if byte == ord("I") else signal.SIGKILL)
    _, status = os.waitpid(kernel, 0)
    report = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "killed_by": killed_by,
        "peak_mb": round(watch.peak / 2**20, 1) if watch else None,
        "killed_for_memory_mb": [round(b / 2**20, 1) for _, b in watch.killed]
        if watch
        else [],
    }
    try:
        conn.sendall(json.dumps(report).encode() + b"\n")
    except OSError:
        pass
    os._exit(0)


def _note(request, text):
    """A line for the grader's log of this kernel (``sandbox.log``)."""
    try:
        with open(os.path.join(request["kernel_dir"], "sandbox.log"), "a") as log:
            print(f"sandbox: {text}", file=log)
    except OSError:
        pass


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def load_guard(path):
    """The attention guard (``grading/sealed/guard``), loaded before any student code so that
    every kernel forked from here maps it: it captures PyTorch's attention kernels and
    registers over them, for good. A zygote without it serves no kernel."""
    import torch

    torch.ops.load_library(path)
    count = ctypes.CDLL(path).attention_guard_count()
    if count < 1:
        raise OSError("it guards no operator in this build of PyTorch")


_FUSE_ATTENTION = "torch._inductor.fx_passes.fuse_attention"


def _without_rewrites(module):
    module._sfdp_init = lambda *args, **kwargs: None


class _NoAttentionRewrites:
    """Imports inductor's attention patterns with their registration emptied. A finder,
    not an import here: inductor costs each kernel 40 MB of memory and address space,
    and most notebooks never compile."""

    def find_spec(self, name, path, target=None):
        if name != _FUSE_ATTENTION:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    _without_rewrites(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def no_attention_rewrites():
    """torch.compile's inductor rewrites a matmul-softmax-matmul into PyTorch's fused
    attention: an honest answer, compiled, would call what the guard switches off. The
    rewrite is switched off before any student code (a student who switches it back on
    only refuses their own answer)."""
    if _FUSE_ATTENTION in sys.modules:
        _without_rewrites(sys.modules[_FUSE_ATTENTION])
    else:
        sys.meta_path.insert(0, _NoAttentionRewrites())


def eager_compiles():
    """``torch.compile`` runs the function it wraps as written (its "force_eager"
    stance): grading builds no native code, which the jail's ``noexec`` writable
    folders could not load and the sealed process could not map, and inductor never
    rewrites an honest answer into PyTorch's attention. A compiled answer gets the same
    grade as the function it compiles."""
    import torch

    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is not None:  # PyTorch 2.6 and later
        set_stance("force_eager")


def warm_up():
    """PyTorch sets up each operation's dispatch on its first call, a few milliseconds
    each: call the ones every chapter uses once here, so that no kernel pays for them.
    The tensors are tiny, so no operation starts PyTorch's intra-op thread pool (whose
    threads a forked kernel would not have). The global random state is put back as it
    was: a kernel draws what it would have drawn without this."""
    import torch
    import torch.nn.functional as F

    state = torch.get_rng_state()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=generator, requires_grad=True)
    layer = torch.nn.Linear(4, 4, bias=False)
    scores = layer(x) @ x.transpose(-2, -1) / 2.0  # (2, 3, 3)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    out = torch.einsum("bij,bjd->bid", weights, x) + F.layer_norm(x, (4,))
    out = F.dropout(out, 0.0) + F.gelu(out) + F.relu(out) + torch.exp(out).sqrt()
    out.sum().backward()
    torch.allclose(out, out.detach().clone())
    torch.set_rng_state(state)


def preload(guard=None):
    """What every kernel would import: done once here, shared by every fork."""
    import matplotlib

    matplotlib.use("Agg")
    # what IPKernelApp.initialize imports (its debugger, debugpy: a tenth of a second),
    # without debugpy's warning about frozen modules
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    import ipykernel.debugger  # noqa: F401
    import ipykernel.ipkernel  # noqa: F401
    import ipykernel.kernelapp  # noqa: F401
    import ipykernel.zmqshell  # noqa: F401
    import IPython  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401

    # what torch.compile and inductor's settings (``no_attention_rewrites``) need: seconds
    import torch._dynamo  # noqa: F401
    import torch.nn.functional  # noqa: F401
    import torch.overrides  # noqa: F401
    import torch.utils._python_dispatch  # noqa: F401

    try:
        import tqdm.auto  # noqa: F401
    except ImportError:
        pass
    eager_compiles()
    warm_up()
    if guard is not None:
        no_attention_rewrites()
        try:
            load_guard(guard)
        except Exception as exc:  # noqa: BLE001 (the grader refuses to grade without it)
            print(f"attention guard: could not load {guard}: {exc}", file=sys.stderr)
            sys.exit(1)


MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_COLLAPSE = 14, 15, 25
HUGE_PAGE = 2 * 2**20


def in_huge_pages():
    """Fold the preload's anonymous memory (its heap and PyTorch's, about 200 MB) into
    2 MB pages (``MADV_COLLAPSE``, Linux 6.1 and later), once. A fork then copies one
    page-table entry per 2 MB instead of 512, and an exit frees as few: a kernel's fork
    and end cost about a fifth of what they did (each kernel forks twice: its watcher,
    then itself). A kernel that writes to a shared huge page still copies only the 4 kB
    it writes (the kernel splits the mapping), so no kernel holds more memory. New
    memory stays in 4 kB pages (``MADV_NOHUGEPAGE`` after), here and in every kernel.
    Best effort: where it is refused (an older kernel, no free huge page), the memory
    stays as it was."""
    madvise = _libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        anonymous = len(fields) < 6 or fields[5] == "[heap]"
        if not (anonymous and fields[1].startswith("rw")):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start = -(-start // HUGE_PAGE) * HUGE_PAGE
        end = end // HUGE_PAGE * HUGE_PAGE
        if end > start:
            madvise(start, end - start, MADV_HUGEPAGE)
            madvise(start, end - start, MADV_COLLAPSE)
            madvise(start, end - start, MADV_NOHUGEPAGE)


def address_space_kb() -> int:
    """This process's address space (VmSize), which each kernel forked from it inherits."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    return 0


def main(socket_path, config_json):
    config = json.loads(config_json)
    die_with_parent()
    enter_namespaces(config)
    preload(config.get("guard"))
    # What the preload made stays shared with every kernel: a kernel's garbage collector
    # would otherwise walk (and so write to, and copy) every one of those objects.
    gc.freeze()
    in_huge_pages()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(64)
    # stdout is the grader's pipe: "ready" says the preload is done, with the address
    # space every kernel starts from (kB, what RLIMIT_AS counts); then it is closed.
    devnull = os.open(os.devnull, os.O_RDWR)
    print("ready", address_space_kb(), flush=True)
    os.dup2(devnull, 1)
    os.dup2(devnull, 0)
    first, count = config["kernel_ids"] or (None, 0)
    served = 0
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
        # root's kernels: each its own unprivileged id, so no two share a process count
        request["uid"] = None if first is None else first + served % count
        served += 1
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

"""The sandbox's guarantees, checked from inside a jailed kernel."""

import platform
import re
import threading
from pathlib import Path

import pytest

from autograder import paths
from autograder.grading.running.limits import Limits
from autograder.grading.running.sandbox import Sandbox, SandboxUnavailable
from tests.notebooks import memory_hog, run_cells, run_cells_to_end

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(Limits(memory_mb=4096)) as sb:
        yield sb


def test_course_files_are_out_of_reach(sandbox):
    repo = str(paths.REPO)
    (importing, listing, reading) = run_cells(
        sandbox,
        f"import sys; sys.path.insert(0, {repo!r})\nimport solutions",
        f"import os; print(os.path.exists({repo!r}), sorted(os.listdir('/')))",
        f"open({str(paths.REPO / 'solutions' / 'self_attention.py')!r}).read()",
    )
    assert "ModuleNotFoundError" in importing
    assert listing.startswith("False")
    assert "'work'" not in listing
    assert "FileNotFoundError" in reading


def test_no_network_and_only_its_own_processes(sandbox):
    net, procs = run_cells(
        sandbox,
        "import socket\ntry:\n    socket.create_connection(('pypi.org', 443), timeout=3)\n"
        "    print('open')\nexcept OSError as exc:\n    print('closed', exc)",
        "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
    )
    assert net.startswith("closed")
    assert procs.strip() == "[1]"  # the kernel is PID 1 and alone


def test_system_is_read_only_and_mounts_are_locked(sandbox):
    write, umount, remount = run_cells(
        sandbox,
        "open('/usr/evil', 'w')",
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.umount2(b'/usr', 2), ctypes.get_errno())",
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.mount(None, b'/usr', None, 32 | 4096, None), ctypes.get_errno())",
    )
    assert "Read-only file system" in write or "PermissionError" in write
    assert umount.startswith("-1")
    assert remount.startswith("-1")


def test_working_folder_is_private_and_writable(sandbox):
    (first,) = run_cells(
        sandbox, "import os; open('mine.txt', 'w').write('x'); print(os.getcwd())"
    )
    (second,) = run_cells(sandbox, "import os; print(os.listdir('.'))")
    assert first.strip() == "/submission"
    assert second.strip() == "[]"  # another kernel sees nothing of the first


_RUN_WRITTEN = """
import ctypes, ctypes.util, os, shutil, subprocess
libm = ctypes.util.find_library("m")
libm = next(p for p in ("/lib/x86_64-linux-gnu/" + libm, "/usr/lib/x86_64-linux-gnu/" + libm,
                         "/lib64/" + libm, "/usr/lib64/" + libm) if os.path.exists(p))
from ipykernel.connect import get_connection_file
kernel_folder = os.path.dirname(get_connection_file())
for folder in ("/submission", "/tmp", "/dev/shm", kernel_folder):
    program = shutil.copy("/bin/true", os.path.join(folder, "mine"))
    os.chmod(program, 0o755)
    try:
        subprocess.run([program], check=True)
        print(folder, "ran a program")
    except PermissionError:
        pass
    library = shutil.copy(libm, os.path.join(folder, "libmine.so"))
    try:
        ctypes.CDLL(library)
        print(folder, "loaded a library")
    except OSError:
        pass
print("done")
"""


def test_what_the_kernel_writes_it_cannot_run(sandbox):
    """Every writable mount is noexec: a program or library written during grading
    neither runs nor loads (the kernel's own folder included), while the read-only
    system's do."""
    (out,) = run_cells(sandbox, _RUN_WRITTEN)
    assert out.strip() == "done", out
    (mounts,) = run_cells(
        sandbox,
        "for line in open('/proc/self/mountinfo'):\n"
        "    fields = line.split()\n"
        "    point, options = fields[4], fields[5].split(',')\n"
        "    if 'rw' in options and not point.startswith(('/dev/', '/proc')):\n"
        "        print(point, 'noexec' in options)",
    )
    writable = dict(line.split() for line in mounts.strip().splitlines())
    assert {"/tmp", "/submission"} <= set(writable), mounts
    assert set(writable.values()) == {"True"}, mounts


def test_torch_compile_runs_the_function_as_written(sandbox):
    """Grading compiles nothing (the zygote's "force_eager" stance): a compiled function
    gives the eager result at every shape, at once, with no native code built."""
    (out,) = run_cells(
        sandbox,
        "import time, torch\n"
        "def f(x):\n"
        "    return (x @ x.transpose(-2, -1)).softmax(-1) @ x\n"
        "g = torch.compile(f)\n"
        "start = time.perf_counter()\n"
        "for n in (3, 5, 7):\n"
        "    x = torch.randn(2, n, 4)\n"
        "    assert torch.equal(g(x), f(x))\n"
        "print('same', time.perf_counter() - start < 5)",
    )
    assert out.strip() == "same True", out


def test_memory_limit_raises_instead_of_exhausting_the_machine(sandbox):
    (big,) = run_cells(
        sandbox, "import torch; x = torch.empty(2**40, dtype=torch.uint8)"
    )
    assert "RuntimeError" in big or "MemoryError" in big


def test_pytorch_works_and_is_preloaded(sandbox):
    (out,) = run_cells(
        sandbox,
        "import sys; print('torch' in sys.modules)\n"
        "import torch; print(float((torch.ones(64, 64) @ torch.ones(64, 64))[0, 0]))",
    )
    assert out.split() == ["True", "64.0"]


def _huge_pages_offered() -> bool:
    """Transparent huge pages not switched off, and a kernel that knows
    ``MADV_COLLAPSE`` (Linux 6.1)."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    release = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
    return "[never]" not in mode and release >= (6, 1)


def test_the_preload_is_shared_in_huge_pages(sandbox):
    """What the warm process preloaded is held in 2 MB pages (``zygote.in_huge_pages``):
    a kernel's fork copies one page-table entry for each, not 512."""
    if not _huge_pages_offered():
        pytest.skip("this machine's kernel offers no huge pages to collapse into")
    rollup = Path(f"/proc/{sandbox.process.pid}/smaps_rollup").read_text()
    huge_mb = int(re.search(r"AnonHugePages:\s+(\d+)", rollup).group(1)) // 1024
    assert huge_mb >= 64, rollup


def test_no_route_out_but_its_own_loopback_works(sandbox):
    (out,) = run_cells(
        sandbox,
        "import socket\nserver = socket.create_server(('127.0.0.1', 0))\n"
        "socket.create_connection(server.getsockname(), timeout=3); print('local ok')\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
        "    print('open')\nexcept OSError as exc:\n    print('closed', exc)",
    )
    assert out.startswith("local ok\nclosed"), out


SEGMENT = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0x5EED, 2**20, {flags}), open('/proc/sysvipc/shm').read().count('\\n'))
"""


def test_sysv_segments_end_with_their_kernel(sandbox):
    (made,) = run_cells(sandbox, SEGMENT.format(flags="0o1000 | 0o666"))
    (seen,) = run_cells(sandbox, SEGMENT.format(flags="0"))
    assert made.split() == ["0", "2"]  # made: a heading and one segment
    assert seen.split() == ["-1", "1"]  # the next kernel has none


LISTENER = """
import socket, time
server = socket.socket(socket.AF_UNIX)
server.bind(b"\\0course-isolation-test"); server.listen()
time.sleep(20)
"""

CALLER = """
import socket, time
deadline, said = time.monotonic() + 12, "refused"
while time.monotonic() < deadline and said == "refused":
    try:
        socket.socket(socket.AF_UNIX).connect(b"\\0course-isolation-test")
        said = "connected"
    except OSError:
        time.sleep(0.2)
print(said)
"""


def test_kernels_running_together_share_no_abstract_socket(sandbox):
    listener = threading.Thread(target=run_cells, args=(sandbox, LISTENER))
    listener.start()
    (said,) = run_cells(sandbox, CALLER)
    listener.join()
    assert said.strip() == "refused"


@pytest.mark.parametrize("form", ["sysv", "memfd", "tmpfs", "mmap"])
def test_memory_in_any_form_counts_in_the_peak(sandbox, form):
    (out,), end = run_cells_to_end(sandbox, memory_hog(form, 600))
    assert out == "", out
    assert end.peak_mb >= 600 and not end.killed_for_memory_mb, end


def test_a_memory_limit_no_kernel_can_start_under_is_refused_with_its_reason():
    """Under a limit below what PyTorch takes before any cell runs every kernel would die
    at start, the canary first, with a message about a broken machine: the grader says
    what is wrong and what limit to use instead."""
    with pytest.raises(SandboxUnavailable, match=r"--memory-mb \d+ or more"):
        Sandbox(Limits(memory_mb=512))


# Shared memory past the limit, four threads at once, the kernel recording what it holds
# (in its kernel directory, on the grader's disk) after each 10 MB.
FAST_HOG = """
import os, threading
from ipykernel.connect import get_connection_file
record = os.open(os.path.join(os.path.dirname(get_connection_file()), "held"),
                 os.O_WRONLY | os.O_CREAT)
lock, held, files = threading.Lock(), [0], []
def hog():
    chunk = b"x" * 2**20
    while True:
        fd = os.memfd_create("hog")
        files.append(fd)
        for _ in range(20):
            for _ in range(10):
                os.write(fd, chunk)
            with lock:
                held[0] += 10
                os.pwrite(record, str(held[0]).rjust(12).encode(), 0)
threads = [threading.Thread(target=hog) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
"""
MARGIN_MB = 256  # limits.py's stated margin


def test_memory_past_the_limit_on_a_busy_machine_is_stopped_within_the_margin():
    """A kernel that fills shared memory past a 2048 MB limit from four threads, while
    four busy processes per core keep the machine loaded: it is killed for memory, and
    neither what it recorded holding nor the watch's peak is past the limit plus the
    margin ``Limits`` states."""
    import os
    import subprocess
    import sys
    import time

    import nbformat
    from nbclient import NotebookClient

    limit = 2048
    with Sandbox(Limits(memory_mb=limit)) as sb:
        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(4 * os.cpu_count())
        ]
        try:
            time.sleep(1)
            nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FAST_HOG)])
            with sb.kernel() as (km, workdir):
                client = NotebookClient(
                    nb, km=km, allow_errors=True, timeout=120,
                    resources={"metadata": {"path": str(workdir)}},
                )  # fmt: skip
                try:
                    client.execute()
                except Exception:  # noqa: BLE001 (the kernel died: that is the point)
                    pass
                # runnable now, of all processes (/proc/loadavg's fourth field)
                running = int(
                    Path("/proc/loadavg").read_text().split()[3].split("/")[0]
                )
                end = sb.end(km, workdir)
                held = int(Path(km.connection_file).with_name("held").read_text())
        finally:
            for burner in burners:
                burner.kill()
                burner.wait()
    assert end.killed_for_memory_mb, end
    assert held <= limit + MARGIN_MB, (held, end)
    assert limit < end.peak_mb <= limit + MARGIN_MB, end
    assert running >= 2 * os.cpu_count(), running  # the machine really was busy

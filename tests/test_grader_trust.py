"""A grader fault is never a student's zero: the jail is proven before grading, a host
that refuses it gets one message and no grades, faults are retried or reported as no
grade, and limits hold for a submission's processes together."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder import paths
from autograder.grading.grade import Batch, grade_many, grade_notebook
from autograder.grading.running.limits import Limits
from autograder.grading.running.preflight import prove
from autograder.grading.running.sandbox import Sandbox, SandboxUnavailable
from autograder.grading.running.sandbox.diagnose import APPARMOR_PROFILE, cause
from tests.notebooks import (
    memory_hog,
    release_notebook,
    run_cells,
    student_notebook,
    user_environment,
    write,
)

pytestmark = pytest.mark.slow
CHAPTER = "03_self_attention"
DENY = Path(__file__).with_name("deny_syscalls.py")


def _passed(result) -> set[str]:
    return {t["id"] for t in result["tests"] if t["passed"]}


def _with_first_cell(nb, source):
    nb.cells.insert(1, nbformat.v4.new_code_cell(source))
    return nb


@pytest.mark.parametrize("call", ["unshare", "mount"])
def test_a_host_that_refuses_the_jail_grades_nothing_and_says_why(tmp_path, call):
    notebook = write(student_notebook(CHAPTER), tmp_path / "right.ipynb")
    run = subprocess.run(
        [sys.executable, str(DENY), call, "--", sys.executable, "-m", "autograder",
         "grade", str(notebook), "--json"],
        cwd=paths.REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert run.stdout == ""  # no result line: nothing graded
    assert run.stderr.count("The grading sandbox cannot start") == 1
    assert "Cause:" in run.stderr and "Operation not permitted" in run.stderr
    assert "Traceback" not in run.stderr


def _fake_proc(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_each_cause_gets_its_fix(tmp_path):
    denied = "mount /: Operation not permitted"
    sysctl = _fake_proc(tmp_path / "a", {"sys/kernel/unprivileged_userns_clone": "0"})
    assert "kernel.unprivileged_userns_clone=1" in cause(denied, sysctl, uid=1000)
    off = _fake_proc(tmp_path / "b", {"sys/user/max_user_namespaces": "0"})
    assert "user.max_user_namespaces=15000" in cause(denied, off, uid=1000)
    ubuntu = _fake_proc(
        tmp_path / "c", {"sys/kernel/apparmor_restrict_unprivileged_userns": "1"}
    )
    fix = cause(denied, ubuntu, uid=1000)
    assert "apparmor_parser -r" in fix and str(APPARMOR_PROFILE) in fix
    assert APPARMOR_PROFILE.is_file() and "userns," in APPARMOR_PROFILE.read_text()
    docker = _fake_proc(tmp_path / "d", {"1/cgroup": "0::/docker/abc"})
    if not (os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")):
        assert "Operation" not in cause(denied, tmp_path / "empty", uid=1000)
    assert "seccomp=unconfined" in cause(denied, docker, uid=1000)
    hidden = cause("ModuleNotFoundError: No module named 'torch'", docker, uid=1000)
    assert "Python installation" in hidden


def test_a_kernel_that_cannot_start_says_why():
    with Sandbox(
        Limits(disk="not-a-size")
    ) as sandbox:  # every jail's tmpfs mount fails
        with pytest.raises(SandboxUnavailable) as raised:
            prove(sandbox)
    assert "mount" in str(raised.value) and "nothing was graded" in str(raised.value)


def test_a_batch_whose_kernels_fail_to_start_stops_and_records_no_grade(tmp_path):
    notebook = write(student_notebook(CHAPTER), tmp_path / "right.ipynb")
    with Sandbox(Limits(disk="not-a-size")) as sandbox:
        batch = Batch(sandbox, 0, sandbox.limits)
        results = [
            grade_notebook(
                notebook, CHAPTER, 0, sandbox=sandbox, retry=False, batch=batch
            )
            for _ in range(4)
        ]
    assert not any(r["graded"] for r in results)
    assert all("kernel did not start" in r["message"] for r in results[:3])
    assert "the batch was stopped" in results[3]["message"]
    assert all("tmpfs" in r["message"] or "mount" in r["message"] for r in results[:3])


_IMPORTS_IN_JAIL = """
import sys
from autograder.grading.running.sandbox import Sandbox
from autograder.grading.running.preflight import prove
from tests.notebooks import run_cells
with Sandbox() as sandbox:
    prove(sandbox)
    print(run_cells(sandbox, "import torch, sys; print('jailed', sys.prefix)")[0])
"""


def _venv(path: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)],
        check=True,
    )  # fmt: skip
    return path / "bin" / "python"


@pytest.mark.parametrize("where", ["tmp", "repo"])
def test_the_python_installation_may_live_anywhere(tmp_path, where):
    """A venv under /tmp (the jail has its own /tmp) or inside the course (the jail hides
    the course): each used to kill every kernel at start."""
    folder = tmp_path / "venv" if where == "tmp" else paths.REPO / ".venv-trust-test"
    try:
        python = _venv(folder)
        run = subprocess.run(
            [str(python), "-c", _IMPORTS_IN_JAIL],
            cwd=paths.REPO, capture_output=True, text=True, timeout=300,
            env=user_environment(PYTHONPATH=str(paths.REPO)),
        )  # fmt: skip
    finally:
        if where == "repo":
            shutil.rmtree(folder, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"jailed {folder}" in run.stdout


def test_the_users_own_site_packages_are_seen(tmp_path):
    user_site = (
        tmp_path
        / "userbase"
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / "site-packages"
    )
    user_site.mkdir(parents=True)
    (user_site / "course_user_package.py").write_text("WHERE = 'user site'\n")
    script = _IMPORTS_IN_JAIL.replace(
        "import torch, sys; print('jailed', sys.prefix)",
        "import course_user_package; print('jailed', course_user_package.WHERE)",
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=paths.REPO, capture_output=True, text=True,
        timeout=300,
        env=user_environment(PYTHONPATH=str(paths.REPO), PYTHONUSERBASE=str(tmp_path / "userbase")),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "jailed user site" in run.stdout


@pytest.mark.skipif(os.getuid() != 0, reason="the grader runs as root only here")
def test_under_root_a_kernel_is_not_root_outside_the_jail():
    with Sandbox() as sandbox:
        uid, setuid = run_cells(
            sandbox,
            "import os; print(os.getuid(), os.getgid(), os.getgroups())",
            "import os; os.setuid(0)",
        )
    numbers = uid.split()
    assert int(numbers[0]) >= Limits().kernel_uid and numbers[0] == numbers[1]
    assert "PermissionError" in setuid


@pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("unshare") is None,
    reason="needs root to map an ordinary uid for the grader",
)
def test_an_ordinary_users_grader_passes_the_check():
    """The grader as uid 1000 (an ordinary user's code path: its kernels keep its uid and
    lock their mounts with a user namespace of their own)."""
    run = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable,
         "-m", "autograder", "check"],
        cwd=paths.REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "grader: uid 1000" in run.stdout and "ready to grade" in run.stdout


_LOCKED_KERNEL_DIR = """
import os
from autograder.grading.running.sandbox import Sandbox
with Sandbox() as sandbox:
    with sandbox.kernel() as (km, kernel_dir):
        os.makedirs(kernel_dir / "locked" / "inner")
        os.chmod(kernel_dir / "locked", 0)
    print("left behind" if os.path.lexists(kernel_dir) else "removed")
print("left behind" if os.path.lexists(sandbox.base) else "removed")
"""


@pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("unshare") is None,
    reason="needs root to map an ordinary uid for the grader",
)
def test_an_ordinary_users_grader_leaves_no_kernel_directory_behind():
    """A kernel may make a folder of its kernel directory unreadable (``chmod 0``),
    which stops an ordinary user's ``rmtree``: it is still removed."""
    run = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable,
         "-c", _LOCKED_KERNEL_DIR],
        cwd=paths.REPO, capture_output=True, text=True, timeout=300,
        env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["removed", "removed"], run.stdout


HOG = """
import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(1000 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(30)
        os._exit(0)
    children.append(pid)
# until the watch kills one (or, were it to fail, one ends its sleep): on a loaded
# machine the children may take seconds to touch their memory
deadline = time.monotonic() + 40
while time.monotonic() < deadline and os.waitpid(-1, os.WNOHANG)[0] == 0:
    time.sleep(0.1)
"""


def test_memory_holds_for_a_submissions_processes_together(tmp_path):
    """Four forked children of 1000 MB each under a 3000 MB limit: the largest are killed
    and the result says so; the other submission of the batch never notices."""
    hog = write(
        _with_first_cell(student_notebook(CHAPTER), HOG), tmp_path / "hog.ipynb"
    )
    right = write(student_notebook(CHAPTER), tmp_path / "right.ipynb")
    results = list(
        grade_many([hog, right], CHAPTER, jobs=2, seed=1, limits=Limits(memory_mb=3000))
    )
    # the limit held and was named; the neighbour never noticed
    assert results[0]["graded"], results[0]["message"]
    assert "held more than 3000 MB" in results[0]["message"]
    assert results[1]["score"] == 10.0, results[1]
    assert results[1]["message"] == "", results[1]


def test_memory_held_in_any_form_holds_the_limit(tmp_path):
    """Shared memory that no process maps (SysV segments, memfd files, tmpfs files) past
    the limit: the kernel is killed for memory and its peak says what it held."""
    hogs = [
        write(
            _with_first_cell(student_notebook(CHAPTER), memory_hog(form, 1700)),
            tmp_path / f"{form}.ipynb",
        )
        for form in ("sysv", "memfd", "tmpfs")
    ]
    # a kernel's address space alone is about 1.1 GB once PyTorch has imported triton
    limits = Limits(memory_mb=1536, disk="2g")
    results = list(grade_many(hogs, CHAPTER, jobs=2, seed=1, limits=limits))
    for result in results:
        assert result["graded"], result["message"]
        assert "held more than 1536 MB" in result["message"], result
        assert result["peak_mb"] >= 1536, result


FILLER = """
import os
from ipykernel.connect import get_connection_file
folder = os.path.dirname(get_connection_file())
for i in range(3):
    with open(os.path.join(folder, f"filler{i}"), "wb") as f:
        for _ in range(200):
            f.write(b"x" * 2**20)
print("wrote 600 MB")
import time; time.sleep(2)  # a page cache may take it all before the next check
"""


def test_a_kernel_that_fills_its_kernel_directory_is_stopped(tmp_path):
    """The kernel directory lies on the grader's disk: a kernel writing hundreds of MB
    there is killed, and its neighbour in the batch never notices."""
    filler = write(
        _with_first_cell(student_notebook(CHAPTER), FILLER), tmp_path / "filler.ipynb"
    )
    right = write(student_notebook(CHAPTER), tmp_path / "right.ipynb")
    results = list(grade_many([filler, right], CHAPTER, jobs=2, seed=1))
    assert results[0]["graded"], results[0]["message"]
    assert "the kernel died while running code cell 1" in results[0]["message"]
    assert results[1]["score"] == 10.0, results[1]
    assert results[1]["message"] == "", results[1]


BOMB = """
import os, time
started = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(10)
            os._exit(0)
        started += 1
except OSError:
    print("stopped at", started)
"""


def test_a_fork_bomb_is_capped(tmp_path):
    bomb = write(
        _with_first_cell(student_notebook(CHAPTER), BOMB), tmp_path / "bomb.ipynb"
    )
    (result,) = grade_many([bomb], CHAPTER, seed=1)
    assert result["graded"]
    assert _passed(result) >= {"causal_mask_values", "padding_mask_values"}


def _kill_kernels(sandbox_pids, times, killed):
    """Outside the jail, SIGKILL kernels as the host's OOM killer would (``times`` of
    them): a kernel is a grandchild of the zygote."""

    def children(pid):
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
        return found

    deadline = time.monotonic() + 240
    while len(killed) < times and time.monotonic() < deadline:
        for zygote in sandbox_pids():
            for serve in children(zygote):
                for kernel in children(serve):
                    if kernel not in killed:
                        time.sleep(1.5)  # let it start running cells
                        os.kill(kernel, signal.SIGKILL)
                        killed.append(kernel)
        time.sleep(0.2)


@pytest.mark.parametrize("times", [1, 2])
def test_a_kernel_killed_from_outside_is_retried_never_a_zero(tmp_path, times):
    slow = _with_first_cell(student_notebook(CHAPTER), "import time; time.sleep(4)")
    notebook = write(slow, tmp_path / "right.ipynb")
    killed = []
    with Sandbox() as sandbox:
        killer = threading.Thread(
            target=_kill_kernels, args=(lambda: [sandbox.process.pid], times, killed)
        )
        killer.start()
        result = grade_notebook(notebook, CHAPTER, 1, sandbox=sandbox)
        killer.join()
    assert len(killed) == times
    if times == 1:
        assert result["graded"] and result["score"] == 10.0
        assert (
            "second try" in result["message"]
            and "killed from outside" in result["message"]
        )
    else:
        assert not result["graded"]
        assert (
            "grader fault" in result["message"]
            and "killed from outside" in result["message"]
        )


def test_untouched_notebooks_still_score_zero_as_a_grade(tmp_path):
    (result,) = grade_many(
        [write(release_notebook(CHAPTER), tmp_path / "u.ipynb")], CHAPTER
    )
    assert result["graded"] and result["score"] == 0.0


def _kernel_processes() -> list[tuple[int, int]]:
    """(pid, parent pid) of every running jailed kernel that runs as an unprivileged id."""
    out = subprocess.run(
        ["ps", "-eww", "-o", "pid=,ppid=,uid=,args="], capture_output=True, text=True
    ).stdout
    rows = [line.split(None, 3) for line in out.splitlines()]
    return [
        (int(pid), int(ppid))
        for pid, ppid, uid, args in rows
        if "zygote.py" in args and int(uid) >= Limits().kernel_uid
    ]


@pytest.mark.skipif(os.getuid() != 0, reason="kernels change uid only under root")
def test_a_kernel_dies_with_its_supervisor_when_run_as_root():
    """Under root each kernel drops to its own uid, which clears its parent-death
    signal; re-armed, a kernel whose supervisor is killed from outside does not run on
    orphaned."""
    import asyncio

    with Sandbox(Limits()) as sandbox, sandbox.kernel() as (km, _):
        before = set(_kernel_processes())
        asyncio.run(km.start_kernel())
        deadline = time.monotonic() + 60
        while not (set(_kernel_processes()) - before) and time.monotonic() < deadline:
            time.sleep(0.2)
        ((kernel, supervisor),) = set(_kernel_processes()) - before
        os.kill(supervisor, signal.SIGKILL)
        time.sleep(2)
        orphaned = kernel in {pid for pid, _ in _kernel_processes()}
        if orphaned:  # do not leave it running
            os.kill(kernel, signal.SIGKILL)
        assert not orphaned

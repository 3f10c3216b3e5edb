"""Real unix users on this machine, for tests/test_shared_machine.py: created with
``useradd``, each command run as one of them (``runuser``) with their own HOME and a clean
environment, and removed at the end.

The Python installation that runs the tests must be usable by those users. Where it lies
in a folder they cannot enter (pyenv under root's 0700 home, as on the course's CI
machine), each command runs in a mount namespace of its own where that folder shows the
Python installation and nothing else (``PythonView``): on a real shared machine the
course's Python is installed system-wide, and the users see exactly what they would.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# What every user's environment holds: nothing of the test process's (its PYTHONPATH,
# its HOME), as after a login.
BIN = os.path.dirname(sys.executable)
PATH = f"{BIN}:/usr/local/bin:/usr/bin:/bin"


def missing_tools() -> list[str]:
    return [
        t for t in ("useradd", "userdel", "runuser", "unshare") if not shutil.which(t)
    ]


# The marks of a test that sets up a course on this machine with real unix users
ON_THIS_MACHINE = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="creates unix users: needs root"),
    pytest.mark.skipif(
        bool(missing_tools()), reason=f"needs {', '.join(missing_tools())}"
    ),
]


def _closed_ancestor(path: Path) -> Path | None:
    """The outermost folder above ``path`` that other users cannot enter, if any."""
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


class PythonView:
    """Where the Python installation lies in a folder others cannot enter (``closed``):
    a stand-in for that folder (mode 0711) holding only the installation's top folder,
    mounted over it in each command's own mount namespace. Nothing else of ``closed`` is
    visible, and nothing changes outside the command."""

    def __init__(self):
        python = Path(os.path.realpath(sys.executable))
        prefixes = {Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix)}
        closed = {_closed_ancestor(p) for p in prefixes | {python}} - {None}
        self.closed = self.folder = None
        self.shown: list[str] = []
        self.binds: list[tuple[Path, Path]] = []  # more folders shown in the view
        if not closed:
            return
        if len(closed) > 1 or Path("/") in closed:
            raise RuntimeError(f"the Python installation lies in {closed}: unsupported")
        (self.closed,) = closed
        self.shown = sorted(
            {p.relative_to(self.closed).parts[0] for p in prefixes | {python}}
        )
        self.folder = Path(tempfile.mkdtemp(prefix="ac-python-view-"))
        self.folder.chmod(0o711)
        for name in self.shown:
            (self.folder / name).mkdir(mode=0o755)

    def bind(self, source: Path, target: Path) -> None:
        """In every command's view, ``source`` shows at ``target`` (a machine's folder,
        such as ``/etc/profile.d``, as set-up would have written it: nothing changes
        outside the command)."""
        self.binds.append((Path(source), Path(target)))

    def wrap(self, command: list[str]) -> list[str]:
        if self.closed is None and not self.binds:
            return command
        binds = "".join(
            f"mount --rbind {shlex.quote(str(s))} {shlex.quote(str(t))}; "
            for s, t in self.binds
        )
        if self.closed is None:
            return ["unshare", "--mount", "--propagation", "private", "--", "sh",
                    "-c", f'set -e; {binds}exec "$@"', "sh", *command]  # fmt: skip
        script = (
            'set -e; view=$1; closed=$2; shift 2; while [ "$1" != -- ]; do '
            'mount --rbind "$closed/$1" "$view/$1"; shift; done; shift; '
            f'mount --rbind "$view" "$closed"; {binds}exec "$@"'
        )
        return [
            "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            script, "sh", str(self.folder), str(self.closed), *self.shown, "--",
            *command,
        ]  # fmt: skip

    def remove(self):
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


class Users:
    """Unix users made for one test run (``ac-<role>-<random>``), removed by ``remove``."""

    def __init__(self, config_dir: Path):
        self.config_dir = config_dir
        self.suffix = secrets.token_hex(3)
        self.names: list[str] = []
        self.view = PythonView()

    def add(self, role: str) -> str:
        name = f"ac-{role}-{self.suffix}"
        subprocess.run(
            ["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        self.names.append(name)
        return name

    @staticmethod
    def home(name: str) -> Path:
        return Path(os.path.expanduser(f"~{name}"))

    def run(self, user: str, *args, cwd: Path | None = None, status: int | None = 0):
        """``args`` run as ``user`` (from their home unless ``cwd``), with nbgrader's
        system-wide config in ``config_dir``; fails the test unless it exits ``status``
        (None: any)."""
        home = self.home(user)
        env = [
            f"HOME={home}", f"USER={user}", f"LOGNAME={user}", f"PATH={PATH}",
            "LANG=C.UTF-8", f"JUPYTER_CONFIG_PATH={self.config_dir}",
        ]  # fmt: skip
        command = ["runuser", "-u", user, "--", "env", "-i", *env, *map(str, args)]
        run = subprocess.run(
            self.view.wrap(command), cwd=cwd or home, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        if status is not None:
            assert run.returncode == status, (
                f"{user}: {' '.join(map(str, args))} exited {run.returncode}\n"
                f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
            )
        return run

    def nbgrader(self, user: str, *args, **kwargs):
        return self.run(user, sys.executable, "-m", "nbgrader", *args, **kwargs)

    def remove(self):
        """Every user made here, with their home, even after a failure."""
        for name in self.names:
            subprocess.run(
                ["userdel", "--force", "--remove", name], capture_output=True
            )
        self.view.remove()


def copy_working_tree(repo: Path, dest: Path, owner: str):
    """The repository's files as a clone of it holds them (tracked and new, not ignored),
    owned by ``owner``: the instructor's clone, with this working tree's changes."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, check=True, capture_output=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = repo / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    subprocess.run(["chown", "-R", f"{owner}:{owner}", str(dest)], check=True)


@dataclass
class CourseOnMachine:
    """A course on one machine as a test set it up: its users, its temporary base folder,
    the instructor's login, the students' (by role), and the commands run so far."""

    users: Users
    base: Path
    chapter: str = "03_self_attention"
    instructor: str = ""
    students: dict[str, str] = field(default_factory=dict)  # role -> login
    runs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)

    @property
    def clone(self) -> Path:
        """The instructor's clone of the course repository."""
        return Users.home(self.instructor) / "attention-course"

    @property
    def course_root(self) -> Path:
        return self.clone / "autograder" / "course"

    def work(self, role: str) -> Path:
        """Where a student's fetched assignment lies (nbgrader fetches into the cwd)."""
        return Users.home(self.students[role]) / self.chapter

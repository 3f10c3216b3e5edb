"""A JupyterHub on loopback for tests/test_jupyterhub.py, set up from
``deploy/jupyterhub/`` for real unix users (``tests/shared_machine.Users``).

The hub runs as root in the users' view of the Python installation
(``Users.view``), with configurable-http-proxy from npm (installed, pinned, when missing
and root, as ``tests/browser.py`` installs Chromium), on ports picked free on 127.0.0.1.
``stop`` ends the hub, and then every process the course's users still run, by id.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from autograder import paths
from tests.notebooks import user_environment
from tests.shared_machine import Users

CHP = "configurable-http-proxy"
CHP_VERSION = "5.3.0"


def configurable_http_proxy() -> str | None:
    """The proxy's command, installed with npm when missing and root (as on CI)."""
    if not shutil.which(CHP) and os.geteuid() == 0 and shutil.which("npm"):
        subprocess.run(
            ["npm", "install", "--global", f"{CHP}@{CHP_VERSION}"],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    return shutil.which(CHP)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def set_password(user: str) -> str:
    password = secrets.token_urlsafe(12)
    subprocess.run(
        ["chpasswd"], input=f"{user}:{password}\n", text=True, check=True,
        capture_output=True,
    )  # fmt: skip
    return password


class Hub:
    """``jupyterhub -f HUB_DIR/jupyterhub_config.py`` on 127.0.0.1, its log in ``log``."""

    def __init__(
        self,
        users: Users,
        hub_dir: Path,
        log: Path,
        config: Path | None = None,
        ports: list[int] | None = None,
    ):
        """``ports``: an earlier hub's (``self.ports``), for the same address again."""
        self.users, self.hub_dir, self.log = users, hub_dir, log
        self.ports = ports or free_ports(3)
        port, hub_port, api_port = self.ports
        self.url = f"http://127.0.0.1:{port}"
        command = [
            sys.executable, "-m", "jupyterhub", "-f", str(config or hub_dir / "jupyterhub_config.py"),
            "--ip", "127.0.0.1", "--port", str(port),
            "--JupyterHub.hub_ip=127.0.0.1", f"--JupyterHub.hub_port={hub_port}",
            f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{api_port}",
            f"--ConfigurableHTTPProxy.command={configurable_http_proxy()}",
        ]  # fmt: skip
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                users.view.wrap(command), cwd=hub_dir, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def wait(self, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the hub exited: {self.log_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/hub/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"no hub after {timeout}s: {self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self):
        """The hub (SIGTERM: it stops the users' servers), then, by id, whatever the
        course's users still run."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        uids = {pwd.getpwnam(name).pw_uid for name in self.users.names}
        for pid in _processes_of(uids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _processes_of(uids: set[int]) -> list[int]:
    """The ids of the processes that run as one of ``uids`` (read from /proc)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # it ended
            continue
        real = next(
            (line.split()[1] for line in lines if line.startswith("Uid:")), None
        )
        if real is not None and int(real) in uids:
            found.append(int(status.parent.name))
    return found


# What formgrader's autograde button runs for each student in turn, in one process (the
# instructor's server): nbgrader's API, with the config nbgrader finds from the course
# root, at the log level the server gives it.
_FORMGRADER = r"""
import json, sys, time
from nbgrader.apps.api import NbGraderAPI
from nbgrader.apps.baseapp import NbGrader

app = NbGrader()
app.load_config_file()
api = NbGraderAPI(config=app.config)
api.log_level = sys.argv[1]
done = {}
for student in sys.argv[3:]:
    start = time.perf_counter()
    result = api.autograde(sys.argv[2], student)
    done[student] = {**result, "seconds": time.perf_counter() - start}
print(json.dumps(done))
"""


def formgrader_autograde(
    root: Path, assignment: str, students: list[str], level: str = "INFO"
) -> dict[str, dict]:
    """Each student's submission autograded as formgrader's button does it: nbgrader's
    answer (``success``, ``log``, ``error``) and the ``seconds`` it took."""
    run = subprocess.run(
        [sys.executable, "-c", _FORMGRADER, level, assignment, *students], cwd=root,
        capture_output=True, text=True, timeout=600,
        env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    return json.loads(run.stdout.strip().splitlines()[-1])

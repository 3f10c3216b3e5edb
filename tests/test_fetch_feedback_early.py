"""A student presses *Fetch Feedback* (or runs ``nbgrader fetch_feedback``) before any
feedback was returned: they get a plain line, and nothing is logged at CRITICAL, no
traceback. The course's ``release_assignment`` makes the exchange's feedback folder
(autograder/grading/recording/feedback_folder.py), which nbgrader makes only at the first
``release_feedback``; without it, nbgrader's fetch fails (the control below).

The instructor releases with the course's config; the student fetches, submits and asks
for feedback with the system-wide config the shared machine and the hub install, on the
command line and through the Assignments tab's own handler in a real Jupyter server. One
user does both here (no accounts needed); tests/test_shared_machine.py and
tests/test_jupyterhub.py run the same commands as real users. A few seconds."""

import json
import re
import shutil
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from autograder import paths
from autograder.grading.recording import feedback_folder
from tests.hub import free_ports
from tests.notebooks import class_course, user_environment

CH = "03_self_attention"
COURSE = "attention-course"
DEPLOY = paths.REPO / "deploy" / "shared_machine"
VALIDATE = paths.REPO / "autograder" / "grading" / "recording" / "validate_settings.py"
ALARMS = re.compile(r"CRITICAL|Traceback|\[C \d|\[E \d|ERROR")


class Place:
    def __init__(self, base: Path):
        self.base = base
        self.exchange = base / "exchange"
        self.config = base / "etc-jupyter"  # the student's /etc/jupyter
        self.home = base / "student"
        self.feedback = self.exchange / COURSE / "feedback"
        self.env = user_environment(
            HOME=str(self.home),
            JUPYTER_CONFIG_DIR=str(self.config),
            JUPYTER_RUNTIME_DIR=str(base / "runtime"),
            JUPYTER_DATA_DIR=str(self.home / ".local/share/jupyter"),
        )

    def student(self, *args, check=True):
        run = subprocess.run(
            [sys.executable, "-m", "nbgrader", *args], cwd=self.home, env=self.env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if check:
            assert run.returncode == 0, run.stdout + run.stderr
        return run


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    p = Place(tmp_path_factory.mktemp("fetch-early"))
    # the instructor: a course root and its release, released with the course's config
    root = class_course(p.base / "course", CH, {})
    release = root / "release" / CH
    release.mkdir(parents=True)
    shutil.copy(paths.COURSE_ROOT / "source" / CH / f"{CH}.ipynb", release)
    p.exchange.mkdir(mode=0o777)
    p.exchange.chmod(0o1777)  # as setup.sh makes it
    run = subprocess.run(
        [sys.executable, "-m", "nbgrader", "release_assignment", CH,
         f"--Exchange.root={p.exchange}"],
        cwd=root, capture_output=True, text=True, timeout=120,
        env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    # the student's machine-wide config, as setup.sh installs it
    p.config.mkdir()
    text = (DEPLOY / "nbgrader_config.py").read_text()
    text, n = re.subn(r"(?m)^c\.Exchange\.root = .*$",
                      f'c.Exchange.root = "{p.exchange}"', text)  # fmt: skip
    assert n == 1
    (p.config / "nbgrader_config.py").write_text(text)
    shutil.copy(VALIDATE, p.config / "attention_course_validate.py")
    p.home.mkdir()
    return p


def test_the_release_makes_the_feedback_folder_as_release_feedback_would(place):
    assert place.feedback.is_dir()
    assert stat.S_IMODE(place.feedback.stat().st_mode) == 0o711  # no student lists it


def test_fetch_feedback_before_anything_is_submitted_or_returned(place):
    before = place.student("fetch_feedback", CH, "--course", COURSE)
    assert not ALARMS.search(before.stderr), before.stderr
    place.student("fetch_assignment", CH, "--course", COURSE)
    place.student("submit", CH, "--course", COURSE)
    after = place.student("fetch_feedback", CH, "--course", COURSE)
    assert not ALARMS.search(after.stderr), after.stderr
    assert "Could not find feedback for" in after.stderr  # the plain line
    assert not (place.home / CH / "feedback").exists()


def _server(place: Place):
    port, token = free_ports(1)[0], "early-fetch"
    log = open(place.base / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
         f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={place.home}"],
        cwd=place.home, env=place.env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            return proc, log, url, token
        except OSError:
            assert proc.poll() is None, (place.base / "server.log").read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)


def _press_fetch_feedback(url: str, token: str) -> dict:
    """What the Assignments tab's *Fetch Feedback* sends, and the answer it shows."""
    body = json.dumps({"course_id": COURSE, "assignment_id": CH}).encode()
    request = urllib.request.Request(
        f"{url}/assignments/fetch_feedback", data=body, method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 200
        return json.loads(answer.read())


def test_the_assignments_tab_fetch_feedback_before_any_feedback(place):
    """The server extension's handler, as the tab calls it: the submission listed, with
    no feedback, and no traceback in the student's server log. The control: without the
    folder (a course released before this fix), nbgrader's own fetch logs CRITICAL and a
    traceback; the grading-on-submit service's ``ensure`` puts the folder back."""
    if not (place.home / CH).exists():  # run alone
        test_fetch_feedback_before_anything_is_submitted_or_returned(place)
    proc, log, url, token = _server(place)
    server_log = place.base / "server.log"
    try:
        seen = server_log.stat().st_size
        answer = _press_fetch_feedback(url, token)
        assert answer["success"], answer
        (listed,) = [a for a in answer["value"] if a["status"] == "submitted"]
        assert [s["has_exchange_feedback"] for s in listed["submissions"]] == [False]
        time.sleep(0.5)  # the log line written after the answer
        text = server_log.read_text()[seen:]
        assert "Could not find feedback for" in text
        assert not ALARMS.search(text), text

        place.feedback.rmdir()  # the control: nbgrader's behaviour without the folder
        seen = server_log.stat().st_size
        _press_fetch_feedback(url, token)
        time.sleep(0.5)
        text = server_log.read_text()[seen:]
        assert "CRITICAL" in text or "[C " in text, text
        assert "Traceback" in text

        assert feedback_folder.ensure(place.exchange, COURSE) == place.feedback
        assert stat.S_IMODE(place.feedback.stat().st_mode) == 0o711
        seen = server_log.stat().st_size
        _press_fetch_feedback(url, token)
        time.sleep(0.5)
        text = server_log.read_text()[seen:]
        assert not ALARMS.search(text), text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()

"""The course on JupyterHub, as the instructor guide's "On JupyterHub" section sets it up:
``deploy/jupyterhub/setup.sh`` on this machine, the hub on loopback with PAM logins, an
instructor and two students who are real unix users, and every step taken in headless
Chromium through the hub, in the guide's order (``walk``); the tests then check what each
user saw.

Student A hands in right answers; B the unscaled-scores mistake in
``scaled_dot_product_attention`` and ``SelfAttention`` left untouched. The instructor
grades A with formgrader's button, tries B's on a server where the jail cannot start
(a seccomp filter refuses ``unshare``), and grades the class from a terminal in their
JupyterLab. Then the instructor switches on grading on submit: the service the hub
runs grades each submission, B reads his page, A uses up her two graded attempts and is
told so, each page fetched in the Assignments tab; the instructor exports the grades for
Canvas. Runs as root (CI does), which may create users and start the hub; skipped
otherwise. configurable-http-proxy is installed from npm when missing (``tests/hub.py``).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from autograder import paths
from tests.notebooks import user_environment
from tests.shared_machine import (
    ON_THIS_MACHINE,
    CourseOnMachine,
    Users,
    copy_working_tree,
)
from tests.test_shared_machine import (
    CHAPTER,
    COURSE,
    MISTAKEN,
    PAGE,
    UNTOUCHED,
    _answered,
    _inside,
    _points,
)

pytestmark = [
    *ON_THIS_MACHINE,
    pytest.mark.skipif(
        not shutil.which("npm") and not shutil.which("configurable-http-proxy"),
        reason="needs configurable-http-proxy, or npm to install it",
    ),
]

DEPLOY = paths.REPO / "deploy" / "jupyterhub"
SECONDS = 240  # the most any one step in the browser may take
# A folder where the walk leaves each page's last screenshot, what the pages showed and
# the hub's logs, to see why it failed (unset: nothing is kept)
KEEP = os.environ.get("AC_HUB_KEEP")


@dataclass
class Walk(CourseOnMachine):
    """What one walk along the whole path left behind, for the tests to read."""

    hub: object = None  # tests.hub.Hub, the one running now
    sessions: list = field(default_factory=list)  # every Session, to close
    seen: dict[str, object] = field(default_factory=dict)  # what a page showed
    recorded: dict[str, dict] = field(default_factory=dict)  # the gradebook, by stage


def _gradebook_copy(walk: Walk) -> Path | None:
    """The course's gradebook copied as it is now (None before there is one): read
    from the copy, never from the file the instructor's tools write."""
    if not (walk.course_root / "gradebook.db").exists():
        return None
    copy = walk.base / "gradebook-copy.db"
    shutil.copy(walk.course_root / "gradebook.db", copy)
    return copy


def _gradebook(walk: Walk) -> dict:
    """Each student's recorded score, None for no submission."""
    copy = _gradebook_copy(walk)
    if copy is None:
        return {}
    recorded = {}
    with Gradebook(f"sqlite:///{copy}", COURSE) as gb:
        for login in walk.students.values():
            try:
                (nb,) = gb.find_submission(CHAPTER, login).notebooks
            except Exception:  # noqa: BLE001 (MissingEntry: nothing recorded)
                recorded[login] = None
                continue
            recorded[login] = {g.name: g.score for g in nb.grades}
    return recorded


# --- the browser: a hub's pages as each user sees them ----------------------------------


class Session:
    """One user logged in to the hub through its login page, in a context of their own."""

    def __init__(self, browser, hub, user: str, password: str):
        self.hub, self.user = hub, user
        self.context = browser.browser.new_context(
            viewport={"width": 1280, "height": 900}
        )
        self.page = self.context.new_page()
        self.page.set_default_timeout(SECONDS * 1000)
        self.page.goto(f"{hub.url}/hub/login")
        self.page.wait_for_selector("#username_input")
        self.page.fill("#username_input", user)
        self.page.fill("#password_input", password)
        self.page.click("#login_submit")
        self.lab = f"{hub.url}/user/{user}"
        self._started()

    def _started(self):
        self.page.wait_for_url(f"**/user/{self.user}/lab**")
        self.page.wait_for_selector(".lm-MenuBar-itemLabel:text-is('Nbgrader')")

    def open_lab(self):
        """JupyterLab's page with no tabs brought back from earlier visits (``?reset``:
        an earlier terminal would be a second one), loaded with its menus (the nbgrader
        extension's last)."""
        self.page.goto(f"{self.lab}/lab?reset")
        self.page.wait_for_selector(".lm-MenuBar-itemLabel:text-is('Nbgrader')")

    def start(self):
        """The user's server started again from the hub (after the hub restarted)."""
        self.page.goto(f"{self.hub.url}/hub/spawn/{self.user}")
        self._started()

    def menu(self, *labels: str):
        """A JupyterLab menu command: Nbgrader > Formgrader, say."""
        self.page.click(f".lm-MenuBar-itemLabel:text-is('{labels[0]}')")
        for label in labels[1:]:
            self.page.click(f".lm-Menu-itemLabel:text-is('{label}')")

    def menu_items(self, label: str) -> list[str]:
        """The items of one of JupyterLab's menus (closed again)."""
        self.page.click(f".lm-MenuBar-itemLabel:text-is('{label}')")
        self.page.wait_for_selector(".lm-Menu-itemLabel")
        items = self.page.locator(".lm-Menu .lm-Menu-itemLabel").all_inner_texts()
        self.page.keyboard.press("Escape")
        return [item.strip() for item in items if item.strip()]

    def formgrader(self):
        """Formgrader's tab (Nbgrader > Formgrader): the frame inside it."""
        self.menu("Nbgrader", "Formgrader")
        self.page.wait_for_selector("iframe")
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            for frame in self.page.frames:
                if "/formgrader" in frame.url:
                    frame.wait_for_selector("text=Manage Assignments")
                    return frame
            # (time.sleep would hold back Playwright's events, and page.frames with them)
            self.page.wait_for_timeout(500)
        raise TimeoutError("no formgrader frame")

    def terminal(self, command: str, done: Path, timeout: float = SECONDS):
        """``command`` typed into a new JupyterLab terminal of this user's, its output
        and exit status written to ``done`` (``done.out``): read back as root once it
        is there."""
        out = done.with_suffix(".out")
        self.open_lab()
        self.menu("File", "New", "Terminal")
        self.page.wait_for_selector(
            ".jp-Terminal .xterm-helper-textarea", state="attached"
        )
        self.page.click(".jp-Terminal")
        to_out, to_done = shlex.quote(str(out)), shlex.quote(str(done))
        self.page.keyboard.type(f"( {command} ) > {to_out} 2>&1; echo $? > {to_done}")
        self.page.keyboard.press("Enter")
        deadline = time.monotonic() + timeout
        while not done.exists() or not done.read_text().strip():
            assert time.monotonic() < deadline, f"{self.user}: {command} did not end"
            self.page.wait_for_timeout(500)
        return int(done.read_text()), out.read_text(errors="replace")


def _click(frame, selector: str) -> dict:
    """Click a formgrader button and read the dialog it opens (then close it)."""
    frame.click(selector)
    frame.wait_for_selector("#success-modal, #error-modal", state="visible")
    modal = frame.query_selector("#success-modal, #error-modal")
    shown = {
        "id": modal.get_attribute("id"),
        "text": modal.inner_text(),
        "log": "\n".join(p.inner_text() for p in modal.query_selector_all("pre")),
    }
    modal.query_selector("button[data-dismiss='modal']").click()
    frame.wait_for_selector("#success-modal, #error-modal", state="detached")
    return shown


def _row(what: str) -> str:
    return f"tr:has(td:text-is('{what}')), tr:has(a:text-is('{what}'))"


def _assignments_tab(session: Session):
    session.menu("Nbgrader", "Assignment List")
    session.page.wait_for_selector("#released_assignments_list, .assignment-list")


def _validate(session: Session) -> dict:
    """The Assignments tab's Validate button for the fetched notebook, and its dialog."""
    page = session.page
    if not page.is_visible("#fetched_assignments_list button:text-is('Validate')"):
        page.click("#fetched_assignments_list a.assignment-notebooks-link")
    page.click("#fetched_assignments_list button:text-is('Validate')")
    dialog = page.wait_for_selector(".jp-Dialog")
    page.wait_for_selector(
        ".jp-Dialog .validation-passed, .jp-Dialog .validation-failed, .jp-Dialog-body:has-text('Success!')"
    )
    shown = {"text": dialog.inner_text()}
    page.click(".jp-Dialog button.jp-mod-accept, .jp-Dialog .jp-Dialog-button")
    return shown


def _walk(w: Walk, browser) -> Walk:
    from tests.hub import Hub, set_password

    users, runs = w.users, w.runs
    # 1. The accounts, the instructor's clone, and the machine's set-up, as root
    w.instructor = users.add("instr")
    w.students = {role: users.add(role) for role in ("alice", "bob")}
    copy_working_tree(paths.REPO, w.clone, w.instructor)
    hub_dir = w.base / "hub"
    (w.base / "systemd").mkdir()  # setup's unit of grading on submit: not the machine's
    # the login shells' PATH line goes into a copy of the machine's /etc/profile.d,
    # which every command of the users and the hub sees in its place: a terminal in
    # JupyterLab (a login shell) finds `python` as the guide's commands type it
    profile = w.base / "profile.d"
    shutil.copytree("/etc/profile.d", profile)
    users.view.bind(profile, Path("/etc/profile.d"))
    setup = [
        "sh", str(DEPLOY / "setup.sh"), "--exchange", str(w.base / "exchange"),
        "--config-dir", str(users.config_dir), "--hub-dir", str(hub_dir),
        "--python", sys.executable, "--unit-dir", str(w.base / "systemd"),
        "--profile-dir", str(profile), "--instructor", w.instructor,
        *w.students.values(),
    ]  # fmt: skip
    # (in the users' view of the Python installation, as the hub runs: setup.sh checks
    # that they can run it)
    runs["setup"] = subprocess.run(
        users.view.wrap(setup), capture_output=True, text=True, timeout=120
    )
    assert runs["setup"].returncode == 0, runs["setup"].stderr
    passwords = {u: set_password(u) for u in [w.instructor, *w.students.values()]}
    hub = w.hub = Hub(users, hub_dir, w.base / "hub.log")
    hub.wait()

    # 2. The instructor generates and releases the assignment in formgrader
    teacher = Session(browser, hub, w.instructor, passwords[w.instructor])
    w.sessions.append(teacher)
    w.seen["instructor nbgrader menu"] = teacher.menu_items("Nbgrader")
    fg = teacher.formgrader()
    w.seen["formgrader blank"] = not fg.inner_text("body").strip()
    row = _row(CHAPTER)
    w.seen["generate"] = _click(fg, f"{row} >> td.assign a")
    w.seen["release"] = _click(fg, f"{row} >> td.release a")

    # 3. Students: fetch, answer, validate, submit, in the Assignments tab
    sessions = {}
    for role, login in w.students.items():
        s = sessions[role] = Session(browser, hub, login, passwords[login])
        w.sessions.append(s)
        w.seen[f"{role} nbgrader menu"] = s.menu_items("Nbgrader")
        w.seen[f"{role} formgrader status"] = s.page.request.get(
            f"{s.lab}/formgrader"
        ).status
        _assignments_tab(s)
        s.page.click("#released_assignments_list button:text-is('Fetch')")
        s.page.wait_for_selector("#fetched_assignments_list button:text-is('Submit')")
        w.seen[f"{role} validate untouched"] = _validate(s) if role == "bob" else None
    notebook = {role: w.work(role) / f"{CHAPTER}.ipynb" for role in w.students}
    _answered(notebook["alice"])
    _answered(notebook["bob"], mistaken=[MISTAKEN], untouched=[UNTOUCHED])
    for role, s in sessions.items():
        w.seen[f"{role} validate"] = _validate(s)
        s.page.click("#fetched_assignments_list button:text-is('Submit')")
        s.page.wait_for_selector(
            "#submitted_assignments_list .list_item, #submitted_assignments_list li"
        )

    # 4. The instructor collects, then grades one student from formgrader's button
    fg = teacher.formgrader()
    w.seen["collect"] = _click(fg, f"{row} >> td.collect a")
    alice, bob = w.students["alice"], w.students["bob"]

    def submissions():
        fg.click(f"{row} >> td.num-submissions a")
        fg.wait_for_selector(_row(alice))

    submissions()
    started = time.monotonic()
    w.seen["autograde one"] = _click(fg, f"{_row(alice)} >> td.autograde a")
    w.seen["autograde one seconds"] = time.monotonic() - started
    w.recorded["after one"] = _gradebook(w)

    # 5. The jail cannot start (a host that refuses user namespaces, here a seccomp
    # filter on the instructor's server): formgrader's button for B says so
    w.seen["on-submit service"] = [
        line for line in hub.log_text().splitlines() if "on-submit" in line
    ]
    hub.stop()
    nojail = hub_dir / "jupyterhub_config_nojail.py"
    deny = w.clone / "tests" / "deny_syscalls.py"
    nojail.write_text(
        'load_subconfig("jupyterhub_config.py")\n'
        f"c.Spawner.cmd = [{sys.executable!r}, {str(deny)!r}, 'unshare', '--', *c.Spawner.cmd]\n"
    )
    hub = w.hub = Hub(
        users, hub_dir, w.base / "hub-nojail.log", config=nojail, ports=hub.ports
    )
    hub.wait()
    teacher = Session(browser, hub, w.instructor, passwords[w.instructor])
    w.sessions.append(teacher)
    fg = teacher.formgrader()
    submissions()
    w.seen["autograde without a jail"] = _click(fg, f"{_row(bob)} >> td.autograde a")
    w.recorded["without a jail"] = _gradebook(w)
    hub.stop()
    hub = w.hub = Hub(users, hub_dir, w.base / "hub-again.log", ports=hub.ports)
    hub.wait()

    # 6. The class, with one command in the instructor's JupyterLab terminal; formgrader
    # shows what it recorded
    teacher = Session(browser, hub, w.instructor, passwords[w.instructor])
    w.sessions.append(teacher)
    started = time.monotonic()
    w.seen["python in a terminal"] = teacher.terminal(
        "command -v python", Users.home(w.instructor) / "which-python.status"
    )
    w.seen["class autograde"] = teacher.terminal(
        f"cd ~/attention-course && python -m autograder autograde {CHAPTER}"
        " --jobs 2 --force",
        Users.home(w.instructor) / "class-autograde.status",
    )
    w.seen["class autograde seconds"] = time.monotonic() - started
    w.recorded["class"] = _gradebook(w)
    fg = teacher.formgrader()
    submissions()
    w.seen["scores"] = {
        login: fg.inner_text(f"{_row(login)} >> td.score") for login in (alice, bob)
    }

    # 7. Feedback: generated and released in formgrader, fetched in the Assignments tab,
    # opened by each student
    fg.click("a:text-is('Manage Assignments')")
    fg.wait_for_selector(row)
    w.seen["generate feedback"] = _click(fg, f"{row} >> td.generate-feedback a")
    w.seen["release feedback"] = _click(fg, f"{row} >> td.release-feedback a")
    for role, s in sessions.items():
        s.start()  # their server, stopped with the hub
        _assignments_tab(s)
        s.page.click("#submitted_assignments_list button:text-is('Fetch Feedback')")
        s.page.wait_for_selector(
            "#submitted_assignments_list a:has-text('view feedback')"
        )
        s.page.click("#submitted_assignments_list a:has-text('view feedback')")
        # the file browser is now in the feedback's folder; the page opens in a tab of
        # its own (JupyterLab's "Open in New Browser Tab": its address under files/)
        (page,) = (w.work(role) / "feedback").glob(f"*/{CHAPTER}.html")
        s.page.goto(f"{s.lab}/files/{page.relative_to(Users.home(w.students[role]))}")
        s.page.set_viewport_size({"width": 1280, "height": 800})
        w.seen[f"{role} feedback"] = s.page.evaluate(f"() => {{ {PAGE} }}")

    # 8. What a student's own terminal can read of others' work
    own = w.work("alice") / f"{CHAPTER}.ipynb"
    others = {
        "B's home": ["ls", Users.home(bob)],
        "B's notebook": ["cat", w.work("bob") / f"{CHAPTER}.ipynb"],
        "the course root": ["ls", w.course_root],
        "solutions": ["ls", w.clone / "solutions"],
        "the gradebook": ["cat", w.course_root / "gradebook.db"],
    }
    w.seen["probe"] = others
    command = "; ".join(
        f"echo {shlex.quote('== ' + name)}; {how} {shlex.quote(str(path))} | head -c 40; echo"
        for name, (how, path) in {**others, "A's notebook": ["cat", own]}.items()
    )
    w.seen["terminal"] = sessions["alice"].terminal(
        command, Users.home(alice) / "probe.status"
    )

    # 9. Grading on submit (the guide's "Feedback on submit"): the instructor switches
    # it on for the chapter in a terminal, two graded attempts, the best kept; the
    # service the hub runs grades what is in the exchange (each student's submission
    # above: their first attempt). B fetches his page; A hands in a mistaken notebook
    # (her second attempt, the last graded), then once more (kept, not graded until the
    # due date), fetching her page in the Assignments tab after each. The instructor
    # then exports the grades for Canvas.
    rules = {CHAPTER: {"attempts": 2, "keep": "best", "due": "2099-01-01 00:00:00"}}
    config = w.course_root / "nbgrader_config.py"
    line = shlex.quote(f"c.GradeOnSubmit.assignments = {rules!r}")
    w.seen["switch on"] = teacher.terminal(
        f"echo {line} >> {shlex.quote(str(config))}",
        Users.home(w.instructor) / "switch-on.status",
    )
    log = w.course_root / "on_submit" / "service.log"

    def service_log() -> str:
        return log.read_text() if log.exists() else ""

    _wait_for(lambda: f"grading on submit: {CHAPTER}" in service_log(), "switch-on")
    # the guide's restart: the hub starts the service again at once
    pid = (w.course_root / "on_submit" / "service.pid").read_text().strip()
    w.seen["restart"] = teacher.terminal(
        "kill $(cat ~/attention-course/autograder/course/on_submit/service.pid)",
        Users.home(w.instructor) / "restart.status",
    )
    _wait_for(
        lambda: service_log().count(f"grading on submit: {CHAPTER}") >= 2, "restart"
    )
    w.seen["service pids"] = (
        pid,
        (w.course_root / "on_submit" / "service.pid").read_text().strip(),
    )
    w.seen["log after restart"] = service_log()
    w.seen["bob attempt 1"] = _fetched_page(sessions["bob"], w.work("bob"), 1)
    _answered(notebook["alice"], mistaken=[MISTAKEN])
    for n, name in [(2, "alice attempt 2"), (3, "alice held")]:
        s = sessions["alice"]
        s.open_lab()
        _assignments_tab(s)
        s.page.click("#fetched_assignments_list button:text-is('Submit')")
        w.seen[name] = _fetched_page(s, w.work("alice"), n)
    w.recorded["on submit"] = _gradebook(w)
    w.seen["provenance"] = _provenance(w)
    out = Users.home(w.instructor) / "canvas.csv"
    w.seen["export"] = teacher.terminal(
        "cd ~/attention-course && python -m autograder export --lms canvas"
        f" --assignment {CHAPTER} --out {shlex.quote(str(out))}",
        Users.home(w.instructor) / "export.status",
    )
    w.seen["canvas"] = out.read_text() if out.exists() else ""
    return w


def _provenance(walk: Walk) -> dict:
    """Each student's kept attempt, as the gradebook's provenance table says."""
    with sqlite3.connect(_gradebook_copy(walk)) as db:
        rows = db.execute("SELECT student, attempt FROM autograder_provenance")
        return {student: json.loads(attempt or "null") for student, attempt in rows}


def _wait_for(condition, what: str, seconds: float = SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.5)


def _fetched_page(session: Session, work: Path, pages: int) -> dict:
    """*Fetch Feedback* in the Assignments tab, again every 2 s until the student has
    ``pages`` feedback pages (one per submission with a page) and the newest is one of
    grading on submit (a page fetched before is fetched again over itself): that page
    opened in the browser, what it showed, axe-core's violations on it, and the seconds
    it took from the call (just after *Submit*)."""
    from tests.browser import axe_violations

    started = time.monotonic()
    session.open_lab()
    _assignments_tab(session)
    button = "#submitted_assignments_list button:text-is('Fetch Feedback')"

    def fetched() -> list[Path]:
        found = sorted((work / "feedback").glob(f"*/{CHAPTER}.html"))
        on_submit = found and 'class="on-submit"' in found[-1].read_text()
        return found if len(found) >= pages and on_submit else []

    while not fetched():
        assert time.monotonic() - started < SECONDS, f"{session.user}: no page {pages}"
        session.page.click(button)
        session.page.wait_for_timeout(2000)
    seconds = time.monotonic() - started
    newest = fetched()[-1]
    session.page.goto(
        f"{session.lab}/files/{newest.relative_to(Users.home(session.user))}"
    )
    banner = session.page.locator(".on-submit")
    return {
        "seconds": seconds,
        "banner": banner.inner_text() if banner.count() else None,
        "text": session.page.inner_text("body"),
        "violations": [v["id"] for v in axe_violations(session.page)],
    }


@pytest.fixture(scope="module")
def walk():
    from tests.browser import Browser

    base = Path(tempfile.mkdtemp(prefix="ac-jupyterhub-"))
    base.chmod(0o755)
    users = Users(config_dir=base / "jupyter")
    w = Walk(users, base)
    browser = None
    try:
        browser = Browser(timeout=SECONDS)
        yield _walk(w, browser)
    finally:
        if KEEP:
            _keep(w, Path(KEEP))
        if browser is not None:
            browser.close()
        if w.hub is not None:
            w.hub.stop()
        users.remove()
        shutil.rmtree(base, ignore_errors=True)


def _keep(w: Walk, folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    for i, session in enumerate(w.sessions):
        try:
            session.page.screenshot(path=str(folder / f"{i}-{session.user}.png"))
        except Exception:  # noqa: BLE001 (a page already closed)
            pass
    (folder / "seen.json").write_text(json.dumps(w.seen, default=str, indent=1))
    for log in w.base.glob("hub*.log"):
        shutil.copy(log, folder)


def _probed(output: str) -> dict[str, str]:
    """What the terminal printed under each ``== name`` line."""
    parts = re.split(r"^== (.+)$", output, flags=re.M)
    return {
        name: text.strip() for name, text in zip(parts[1::2], parts[2::2], strict=True)
    }


def test_formgrader_shows_in_its_tab(walk):
    """JupyterHub forbids frames (frame-ancestors 'none'); the instructor's server
    allows its own, so formgrader's tab is not blank."""
    assert walk.seen["formgrader blank"] is False
    for step in ("generate", "release", "collect"):
        assert walk.seen[step]["id"] == "success-modal", walk.seen[step]["text"]


def test_the_hub_runs_grading_on_submit_as_the_instructor(walk):
    """The hub starts the service (``c.JupyterHub.services``) as the instructor: it
    proved its jail and waits for an assignment to be switched on."""
    lines = walk.seen["on-submit service"]
    assert any("grading on submit: none yet" in line for line in lines), lines
    assert not any("Traceback" in line for line in lines), lines


def test_formgrader_is_the_instructors_alone(walk):
    assert {"Formgrader", "Create assignment"} <= set(
        walk.seen["instructor nbgrader menu"]
    )
    for role in walk.students:
        assert walk.seen[f"{role} nbgrader menu"] == ["Assignment List", "Course List"]
        assert walk.seen[f"{role} formgrader status"] == 404


def test_validate_is_right_for_both_students(walk):
    assert (
        "Success! Your notebook passes all the tests."
        in walk.seen["alice validate"]["text"]
    )
    for run in ("bob validate untouched", "bob validate"):
        text = walk.seen[run]["text"]
        assert "Success!" not in text and "The following cell failed" in text, text
    # B's Validate shows the visible check that caught the unscaled scores
    assert (
        f"run this cell after filling in {MISTAKEN}"
        in walk.seen["bob validate"]["text"]
    )


def test_formgraders_button_grades_one_student_with_a_few_log_lines(walk):
    """At the instructor server's default level (INFO), formgrader's log of one
    autograde holds a few lines, none of them the student's code."""
    shown = walk.seen["autograde one"]
    assert shown["id"] == "success-modal", shown["text"][-3000:]
    lines = shown["log"].splitlines()
    assert 0 < len(lines) <= 40, len(lines)
    assert not [line for line in lines if line.startswith("[DEBUG]")]
    # the course's grader ran, in its sandbox
    assert "graded in the course's sandbox: 10/10 points" in shown["log"]
    answer = "return torch.softmax"  # a line of A's notebook that is hers alone
    assert answer not in shown["log"]
    alice = walk.students["alice"]
    assert walk.recorded["after one"] == {alice: _points(), walk.students["bob"]: None}


def test_formgrader_says_when_the_jail_cannot_start_and_records_nothing(walk):
    shown = walk.seen["autograde without a jail"]
    assert shown["id"] == "error-modal"
    assert "[autograder] The grading sandbox cannot start" in shown["text"]
    assert "nothing was graded" in shown["text"]
    assert "SystemExit: 3" not in shown["text"]  # the diagnosis, not a bare exit status
    assert walk.recorded["without a jail"][walk.students["bob"]] is None


def test_the_class_is_graded_with_one_command_and_formgrader_shows_it(walk):
    status, output = walk.seen["class autograde"]
    assert status == 0, output[-3000:]
    alice, bob = walk.students["alice"], walk.students["bob"]
    assert walk.recorded["class"] == {
        alice: _points(),
        bob: _points([MISTAKEN, UNTOUCHED]),
    }
    assert walk.seen["scores"] == {alice: "10 / 10", bob: "2 / 10"}


def test_feedback_shows_the_score_and_the_named_mistake_within_the_width(walk):
    for role, score in [("alice", 10), ("bob", 2)]:
        page = walk.seen[f"{role} feedback"]
        shown = page["score"]
        assert shown and f"Score: {score:.1f} / 10.0" in shown["text"], (role, shown)
        assert _inside(shown), (role, shown)
    mistakes = walk.seen["bob feedback"]["mistakes"]
    assert mistakes and "unscaled" in walk.seen["bob feedback"]["text"]
    for box in mistakes:
        assert _inside(box) and box["textRight"] <= box["width"], box
    assert not walk.seen["alice feedback"]["mistakes"]


def test_grading_on_submit_in_the_assignments_tab(walk):
    """Switched on by the instructor, the hub's service grades each student's
    submission; each page, fetched with *Fetch Feedback* within 30 s of *Submit*, says
    how many graded attempts are left; A's attempt beyond the two is kept with a page
    that says so; the gradebook keeps A's best attempt, with its provenance; the pages
    pass axe-core."""
    status, output = walk.seen["switch on"]
    assert status == 0, output
    alice, bob = walk.students["alice"], walk.students["bob"]
    first = walk.seen["bob attempt 1"]
    assert "Attempt 1 (submitted" in first["banner"], first["banner"]
    assert "1 graded attempt left of 2" in first["banner"]
    assert "Score: 2.0 / 10.0" in first["text"]
    second = walk.seen["alice attempt 2"]
    assert "Attempt 2 (submitted" in second["banner"], second["banner"]
    assert "0 graded attempts left of 2" in second["banner"]
    assert "Score: 10.0 / 10.0" not in second["text"] and "unscaled" in second["text"]
    held = walk.seen["alice held"]
    assert "received and kept, not graded now" in held["banner"], held["banner"]
    assert "you have used your 2 graded attempt(s)" in held["banner"]
    for page in (first, second, held):
        assert page["violations"] == [], page["violations"]
    for page in (second, held):
        assert page["seconds"] <= 30, page["seconds"]
    assert walk.recorded["on submit"] == {
        alice: _points(),  # her first attempt: the best
        bob: _points([MISTAKEN, UNTOUCHED]),
    }
    kept = walk.seen["provenance"]
    assert kept[alice]["number"] == 1 and kept[alice]["why"].startswith("keep=best")
    assert kept[bob]["number"] == 1


def test_the_guides_hub_commands_work_as_typed(walk):
    """A terminal in the instructor's JupyterLab is a login shell: ``python`` is the
    course's (the PATH line setup.sh installs); the service's log is where the guide
    says; ``kill $(cat .../service.pid)`` restarts it (the hub starts it again)."""
    status, output = walk.seen["python in a terminal"]
    assert status == 0 and output.strip() == os.path.join(
        os.path.dirname(sys.executable), "python"
    ), output
    status, output = walk.seen["restart"]
    assert status == 0, output
    before, after = walk.seen["service pids"]
    assert before != after, (before, after)
    log = walk.seen["log after restart"]
    assert f"started (process {after})" in log and "stopped" in log, log[-3000:]


def test_the_instructor_exports_the_grades_for_canvas(walk):
    status, output = walk.seen["export"]
    assert status == 0, output
    rows = list(csv.reader(walk.seen["canvas"].splitlines()))
    assert rows[0] == [
        "Student",
        "ID",
        "SIS User ID",
        "SIS Login ID",
        "Section",
        CHAPTER,
    ]
    assert rows[1][0] == "Points Possible" and float(rows[1][-1]) == 10
    scores = {row[3]: float(row[-1]) for row in rows[2:]}
    assert scores == {walk.students["alice"]: 10, walk.students["bob"]: 2}


def test_a_students_terminal_cannot_read_others_work(walk):
    status, output = walk.seen["terminal"]
    probed = _probed(output)
    assert set(probed) == {*walk.seen["probe"], "A's notebook"}, output
    for name in walk.seen["probe"]:
        assert "Permission denied" in probed[name], (name, probed[name])
    assert '"cells"' in probed["A's notebook"], output  # the probe would see a hole


def test_formgraders_log_holds_student_code_only_at_debug(tmp_path):
    """What formgrader's button logs for one submission: at INFO, the level the
    instructor's server gives nbgrader with this set-up, a few lines and none of the
    student's code; at DEBUG (the level nbgrader takes from a server left as it is),
    the student's code is there."""
    from tests.hub import formgrader_autograde
    from tests.notebooks import class_course, student_notebook

    mine = "# a line of this student's own: 5e0f1c"

    def notebook():
        return student_notebook(CHAPTER, lambda source: f"{mine}\n{source}")

    shown = {}
    for level in ("INFO", "DEBUG"):
        root = class_course(tmp_path / level, CHAPTER, {"s1": notebook})
        subprocess.run(
            [sys.executable, "-m", "nbgrader", "generate_assignment", CHAPTER],
            cwd=root, check=True, capture_output=True, timeout=300,
            env=user_environment(PYTHONPATH=str(paths.REPO)),
        )  # fmt: skip
        (shown[level],) = formgrader_autograde(root, CHAPTER, ["s1"], level).values()
        assert shown[level]["success"], shown[level].get("log", "")[-3000:]
    info = shown["INFO"]["log"].splitlines()
    assert 0 < len(info) <= 30, "\n".join(info)
    assert mine not in shown["INFO"]["log"]
    assert any("graded in the course's sandbox: 10/10 points" in line for line in info)
    assert mine in shown["DEBUG"]["log"]  # the test would see it

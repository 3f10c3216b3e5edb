"""One shared Linux machine, as the instructor guide's "One shared machine" section sets it
up: an instructor and three students, each a real unix user, nbgrader's exchange folder,
no network. The whole path runs once (``term``), in the guide's order, every command as
the user who would type it; the tests then check what each user got.

Students: A hands in right answers; B the unscaled-scores mistake in
``scaled_dot_product_attention`` and ``SelfAttention`` left untouched; C right answers,
after the due date. Runs as root (CI does), which may create users; skipped otherwise.
"""

import csv
import datetime
import errno
import html
import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder import paths
from autograder.grading.judging.spec import load_chapter_tests
from tests.notebooks import answers, release_notebook, source_notebook
from tests.shared_machine import (
    ON_THIS_MACHINE,
    CourseOnMachine,
    Users,
    copy_working_tree,
)

pytestmark = ON_THIS_MACHINE

CHAPTER = "03_self_attention"
COURSE = "attention-course"
DEPLOY = paths.REPO / "deploy" / "shared_machine"
TESTS = load_chapter_tests(CHAPTER)
MISTAKEN, UNTOUCHED = "scaled_dot_product_attention", "SelfAttention"
SEED = "7"


def _points(exercises=()) -> dict[str, float]:
    """Each hidden test's points, 0 for the tests of ``exercises``."""
    return {t.id: 0.0 if t.exercise in exercises else t.points for t in TESTS.tests}


@dataclass
class Term(CourseOnMachine):
    """What one run of the whole path left behind, for the tests to read."""

    nobody: str = "ac-nobody"  # a student id with no submission and no account
    gradebooks: dict[str, dict] = field(default_factory=dict)  # after each autograde
    modes: dict[str, int] = field(default_factory=dict)
    on_submit: Path | None = None  # where A fetched her pages of grading on submit

    @property
    def exchange(self) -> Path:
        return self.base / "exchange"

    @property
    def units(self) -> Path:
        return self.base / "systemd"

    def feedback_page(self, role: str) -> Path:
        (page,) = (self.work(role) / "feedback").glob(f"*/{CHAPTER}.html")
        return page


def _answered(path: Path, mistaken=(), untouched=()):
    """The fetched notebook at ``path`` with the reference answers typed in, as its
    student would: unscaled scores in the exercises ``mistaken``, nothing in ``untouched``."""
    nb = nbformat.read(path, as_version=4)
    filled = answers(CHAPTER)
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id not in filled or grade_id.removeprefix("exercise_") in untouched:
            continue
        cell.source = filled[grade_id]
        if grade_id.removeprefix("exercise_") in mistaken:
            assert " / math.sqrt(d_k)" in cell.source
            cell.source = cell.source.replace(" / math.sqrt(d_k)", "")
    nbformat.write(nb, path)  # in place: still the student's file, with its mode


def _gradebook(term: Term) -> dict:
    """Each student's recorded per-test scores and late penalty (read from a copy: root
    must not leave files of its own in the instructor's course)."""
    copy = term.base / "gradebook-copy.db"
    shutil.copy(term.course_root / "gradebook.db", copy)
    recorded = {}
    with Gradebook(f"sqlite:///{copy}", COURSE) as gb:
        for login in term.students.values():
            (nb,) = gb.find_submission(CHAPTER, login).notebooks
            recorded[login] = {
                "tests": {g.name: g.score for g in nb.grades},
                "late_penalty": nb.late_submission_penalty or 0,
            }
    return recorded


@pytest.fixture(scope="module")
def term():
    base = Path(tempfile.mkdtemp(prefix="ac-shared-machine-"))
    base.chmod(0o755)
    users = Users(config_dir=base / "jupyter")
    try:
        yield _run_term(Term(users, base))
    finally:
        users.remove()
        shutil.rmtree(base, ignore_errors=True)


def _run_term(t: Term) -> Term:
    users, runs = t.users, t.runs
    # 1. The accounts, and the instructor's clone of the course (this working tree)
    t.instructor = users.add("instr")
    t.students = {role: users.add(role) for role in ("alice", "bob", "carol")}
    t.nobody = f"ac-nobody-{users.suffix}"
    copy_working_tree(paths.REPO, t.clone, t.instructor)
    # 2. The machine's set-up, as root; run again, it puts right what was changed since
    # (an exchange as nbgrader would have made it, a home as useradd makes it)
    t.units.mkdir()  # the grading-on-submit unit goes here, not into the machine's
    profile = t.base / "profile.d"  # and the login shells' PATH line
    profile.mkdir()
    setup = ["sh", str(DEPLOY / "setup.sh"), "--exchange", str(t.exchange),
             "--config-dir", str(users.config_dir), "--instructor", t.instructor,
             "--python", sys.executable, "--unit-dir", str(t.units),
             "--profile-dir", str(profile), *t.students.values()]  # fmt: skip
    for run in ("setup", "setup again"):
        if run == "setup again":
            t.exchange.chmod(0o777)
            Users.home(t.students["bob"]).chmod(0o755)
        runs[run] = subprocess.run(setup, capture_output=True, text=True, timeout=60)
        assert runs[run].returncode == 0, runs[run].stderr
    for name, path in [("exchange", t.exchange), ("clone", t.clone)] + [
        (role, Users.home(login)) for role, login in t.students.items()
    ]:
        t.modes[name] = os.stat(path).st_mode
    # 3. The instructor generates and releases the assignment, with a roster
    instructor, root = t.instructor, t.course_root
    roster = t.base / "roster.csv"
    roster.write_text("id,first_name,last_name\n" + "".join(
        f"{login},{role.title()},Student\n" for role, login in t.students.items()
    ))  # fmt: skip
    roster.chmod(0o644)
    users.nbgrader(instructor, "db", "student", "import", roster, cwd=root)
    users.nbgrader(instructor, "generate_assignment", CHAPTER, "--force", cwd=root)
    runs["release"] = users.nbgrader(
        instructor, "release_assignment", CHAPTER, cwd=root
    )
    t.modes["exchange after release"] = os.stat(t.exchange).st_mode
    # 4. Students: list, fetch, answer, validate, submit (C after the due date)
    alice, bob, carol = (t.students[r] for r in ("alice", "bob", "carol"))
    runs["list"] = users.nbgrader(alice, "list", "--course", COURSE)
    for login in t.students.values():
        users.nbgrader(login, "fetch_assignment", CHAPTER, "--course", COURSE)
    notebook = {role: t.work(role) / f"{CHAPTER}.ipynb" for role in t.students}

    def validate(role):
        return users.nbgrader(t.students[role], "validate", notebook[role])

    runs["validate untouched"] = validate("carol")
    _answered(notebook["alice"])
    _answered(notebook["bob"], mistaken=[MISTAKEN], untouched=[UNTOUCHED])
    _answered(notebook["carol"])
    runs["validate right"] = validate("alice")
    runs["validate wrong"] = validate("bob")
    for login in (alice, bob):
        users.nbgrader(login, "submit", CHAPTER, "--course", COURSE)
    due = datetime.datetime.now(datetime.UTC)
    users.nbgrader(instructor, "db", "assignment", "add", CHAPTER,
                   f"--duedate={due:%Y-%m-%d %H:%M:%S.%f} UTC", cwd=root)  # fmt: skip
    users.nbgrader(carol, "submit", CHAPTER, "--course", COURSE)
    # 5. The instructor collects and grades, both ways, and returns feedback
    runs["collect"] = users.nbgrader(instructor, "collect", CHAPTER, cwd=root)
    runs["nbgrader autograde"] = run = users.nbgrader(
        instructor, "autograde", CHAPTER, f"--SandboxedExecute.seed={SEED}", cwd=root,
        status=None,
    )  # fmt: skip
    if run.returncode == 3:  # the grader refused to grade: say why, plainly
        pytest.fail(
            "the grading sandbox cannot start for an unprivileged instructor on this "
            f"machine, so nothing was graded:\n{run.stderr[-2000:]}"
        )
    assert run.returncode == 0, run.stderr[-3000:]
    t.gradebooks["nbgrader autograde"] = _gradebook(t)
    runs["autograder autograde"] = users.run(
        instructor, sys.executable, "-m", "autograder", "autograde", CHAPTER,
        "--force", "--seed", SEED, cwd=t.clone,
    )  # fmt: skip
    t.gradebooks["autograder autograde"] = _gradebook(t)
    users.nbgrader(instructor, "generate_feedback", CHAPTER, cwd=root)
    users.nbgrader(instructor, "release_feedback", CHAPTER, cwd=root)
    for login in t.students.values():
        users.nbgrader(login, "fetch_feedback", CHAPTER, "--course", COURSE)
    users.nbgrader(instructor, "export", cwd=root)
    # 6. A submits in B's name, and in the name of a student who has not submitted
    for other in (bob, t.nobody):
        users.nbgrader(alice, "submit", CHAPTER, "--course", COURSE, "--student", other)
    # --update: nbgrader's own collect would put A's in place of B's own
    runs["collect again"] = users.nbgrader(
        instructor, "collect", CHAPTER, "--update", cwd=root
    )
    # 7. Grading on submit (the guide's "Feedback on submit"), one graded attempt: A
    #    submits once more; the service, run as the instructor as setup's systemd unit
    #    runs it, grades what is in the exchange; A fetches her pages (into a folder of
    #    her own: the ones fetched above stay as they were)
    rules = {CHAPTER: {"attempts": 1, "keep": "last", "due": "2099-01-01 00:00:00"}}
    with open(root / "nbgrader_config.py", "a") as config:
        config.write(f"\nc.GradeOnSubmit.assignments = {rules!r}\n")
    users.nbgrader(alice, "submit", CHAPTER, "--course", COURSE)
    runs["serve"] = users.run(
        instructor, sys.executable, "-m", "autograder", "serve-submissions", "--once",
        "--exchange", t.exchange, cwd=t.clone,
    )  # fmt: skip
    t.on_submit = Users.home(alice) / "on-submit"
    users.run(alice, "mkdir", t.on_submit)
    users.nbgrader(
        alice, "fetch_feedback", CHAPTER, "--course", COURSE, cwd=t.on_submit
    )
    return t


def test_setup_makes_a_sticky_exchange_and_private_homes(term):
    for run in ("setup", "setup again"):
        lines = term.runs[run].stdout.splitlines()
        assert any(line.startswith("exchange ") for line in lines), lines
        assert any(line.startswith("login shells: ") for line in lines), lines
    # nbgrader's release leaves the sticky bit alone (it only checks the mode's rwx bits)
    for name in ("exchange", "exchange after release"):
        assert stat.S_IMODE(term.modes[name]) == 0o1777, oct(term.modes[name])
    assert "Permissions for exchange directory" not in term.runs["release"].stderr
    assert os.stat(term.exchange).st_uid == 0
    for name in ("clone", "alice", "bob", "carol"):
        assert stat.S_IMODE(term.modes[name]) == 0o700, (name, oct(term.modes[name]))
    config = (term.users.config_dir / "nbgrader_config.py").read_text()
    assert f'c.Exchange.root = "{term.exchange}"' in config
    # Validate's settings: a copy of the course's own, which the config loads
    installed = term.users.config_dir / "attention_course_validate.py"
    course = (
        paths.REPO / "autograder" / "grading" / "recording" / "validate_settings.py"
    )
    assert installed.read_bytes() == course.read_bytes()
    # grading on submit: a systemd unit that runs the service as the instructor
    unit = (term.units / "attention-course-on-submit.service").read_text()
    assert f"User={term.instructor}\n" in unit and not re.search("@[A-Z]+@", unit)
    assert (
        f"ExecStart={sys.executable} -m autograder serve-submissions --course-dir "
        f"{term.course_root} --exchange {term.exchange} --jobs 2\n"
    ) in unit
    assert (
        "systemctl daemon-reload && systemctl enable --now" in term.runs["setup"].stdout
    )
    # every login shell finds the course's `python` first: a terminal (a hub's too)
    # types `python`, as the guide's commands do
    line = (term.base / "profile.d" / "attention-course.sh").read_text()
    bin_dir = os.path.dirname(sys.executable)
    assert f'PATH="{bin_dir}:$PATH"; export PATH' in line
    login = subprocess.run(
        ["env", "-i", "sh", "-c", f". {term.base / 'profile.d' / 'attention-course.sh'}"
         "; command -v python"], capture_output=True, text=True,
    )  # fmt: skip
    assert login.stdout.strip() == os.path.join(bin_dir, "python"), login


def test_students_list_fetch_and_validate(term):
    assert f"{COURSE} {CHAPTER}" in term.runs["list"].stderr + term.runs["list"].stdout
    passes = "Success! Your notebook passes all the tests."
    assert passes in term.runs["validate right"].stdout
    for run in ("validate untouched", "validate wrong"):
        out = term.runs[run].stdout
        assert passes not in out and "VALIDATION FAILED" in out, (run, out[-2000:])
    # B's Validate shows the visible check that caught the unscaled scores
    (check,) = [
        cell.source.splitlines()[0]
        for cell in release_notebook(CHAPTER).cells
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        == f"checks_{MISTAKEN}"
    ]
    assert check in term.runs["validate wrong"].stdout


def test_grades_are_right_and_both_autogrades_agree(term):
    a, b, c = (term.students[r] for r in ("alice", "bob", "carol"))
    recorded = term.gradebooks["nbgrader autograde"]
    assert recorded == term.gradebooks["autograder autograde"]
    assert recorded[a] == {"tests": _points(), "late_penalty": 0}
    assert recorded[b] == {
        "tests": _points([MISTAKEN, UNTOUCHED]),
        "late_penalty": 0,
    }
    assert recorded[c] == {"tests": _points(), "late_penalty": TESTS.max_score}
    with open(term.course_root / "grades.csv") as f:
        exported = {row["student_id"]: row for row in csv.DictReader(f)}
    expected = {a: 10.0, b: 2.0, c: 0.0}
    assert {s: float(exported[s]["score"]) for s in expected} == expected
    assert float(exported[c]["late_submission_penalty"]) == 10.0


def test_the_class_summary_prints_the_late_score_the_gradebook_has(term):
    carol = term.students["carol"]
    lines = [
        line
        for line in term.runs["autograder autograde"].stdout.splitlines()
        if carol in line
    ]
    assert lines, term.runs["autograder autograde"].stdout
    for line in lines:
        assert "0/10" in line and "10/10" not in line and "late" in line, line


def test_no_checksum_warnings_for_untampered_submissions(term):
    for run in ("nbgrader autograde", "autograder autograde"):
        log = term.runs[run].stdout + term.runs[run].stderr
        assert not re.search(r"Attribute 'checksum' .* has changed", log), log[-3000:]


def test_collect_refuses_a_submission_in_another_students_name(term):
    """nbgrader takes --student at its word; only the owner of the folder in the
    exchange tells who really submitted it. The course's collect refuses such a
    submission, says so, and keeps the named student's own, even with --update."""
    alice, bob = term.students["alice"], term.students["bob"]
    assert "REFUSED" not in term.runs["collect"].stderr
    log = term.runs["collect again"].stderr
    for other in (bob, term.nobody):
        assert re.search(
            rf"REFUSED .+?: it names {other} but is owned by {alice}; not collected",
            log,
        ), log[-3000:]
    assert "cheating attempt" not in log
    # the exchange keeps each, owned by who really submitted it
    inbound = term.exchange / COURSE / "inbound"
    owners = {p.name.split("+")[0] + " by " + p.owner() for p in inbound.iterdir()}
    assert owners == {f"{s} by {s}" for s in term.students.values()} | {
        f"{bob} by {alice}",
        f"{term.nobody} by {alice}",
    }
    # B's own submission stays collected, though A's in his name is newer; the name
    # with no submission of its own gets none
    submitted = term.course_root / "submitted"
    assert nbformat.read(
        submitted / bob / CHAPTER / f"{CHAPTER}.ipynb", as_version=4
    ) == nbformat.read(term.work("bob") / f"{CHAPTER}.ipynb", as_version=4)
    assert not (submitted / term.nobody).exists()


def test_on_submit_grades_each_students_own_and_counts_their_attempts(term):
    """The service, as the instructor, with real users: each student's own submission
    graded and its page where their `nbgrader fetch_feedback` finds it; A's second,
    beyond her one graded attempt, kept; the ones A made in others' names refused."""
    alice, bob = term.students["alice"], term.students["bob"]
    log = term.runs["serve"].stderr
    for other in (bob, term.nobody):
        assert re.search(
            rf"REFUSED .+?: it names {other} but is owned by {alice}; not graded", log
        ), log[-3000:]
    pages = sorted((term.on_submit / CHAPTER / "feedback").glob(f"*/{CHAPTER}.html"))
    first, second = (p.read_text() for p in pages)
    assert "Attempt 1 (submitted" in first and "0 graded attempts left of 1" in first
    assert "(Score: 10.0 / 10.0)" in first
    assert (
        "you have used your 1 graded attempt(s); it will be graded after the due"
        in (second)
    )
    # the gradebook holds each student's own attempt, with its provenance
    with Gradebook(f"sqlite:///{term.course_root / 'gradebook.db'}", COURSE) as gb:
        assert gb.find_submission(CHAPTER, bob).score < 10
    with sqlite3.connect(term.course_root / "gradebook.db") as db:
        rows = dict(db.execute("SELECT student, attempt FROM autograder_provenance"))
    assert json.loads(rows[alice])["why"].startswith("keep=last")
    assert term.nobody not in rows


PROBE = r"""
import json, os, sys
tried = {}
for name, what, *args in json.loads(sys.argv[1]):
    try:
        if what == "read":
            open(args[0], "rb").read(1)
        elif what == "list":
            os.listdir(args[0])
        elif what == "write":
            open(args[0], "ab").close()
        elif what == "rename":
            os.rename(args[0], args[1])
        elif what == "rmdir":
            os.rmdir(args[0])
        tried[name] = "allowed"
    except OSError as e:
        tried[name] = os.strerror(e.errno) if e.errno else str(e)
print(json.dumps(tried))
"""


def test_one_student_cannot_reach_another_students_work(term):
    """As student A: B's home, B's submission and feedback in the exchange, the
    instructor's course root, the course's folder in the exchange. Each refused by a
    permission, not by a missing file; A's own work, and a folder without the sticky bit,
    show that the probe would see a hole."""
    alice, bob = term.students["alice"], term.students["bob"]
    bob_home, root = Users.home(bob), term.course_root
    course = term.exchange / COURSE
    (bob_submission,) = [
        p
        for p in (course / "inbound").glob(f"{bob}+{CHAPTER}+*")
        if p.owner() == bob  # not the one A made in B's name
    ]
    control = term.base / "no-sticky"  # a scratch exchange made without the sticky bit
    control.mkdir(mode=0o777)
    control.chmod(0o777)
    (control / COURSE).mkdir()
    shutil.chown(control / COURSE, term.instructor)
    denied = {
        "B's notebook": ["read", term.work("bob") / f"{CHAPTER}.ipynb"],
        "B's home": ["list", bob_home],
        "B's nbgrader cache": ["list", bob_home / ".local/share/jupyter"],
        "the exchange's submissions": ["list", course / "inbound"],
        "the exchange's feedback": ["list", course / "feedback"],
        "the release notebook": ["write", course / "outbound" / CHAPTER / f"{CHAPTER}.ipynb"],
        "replace the course folder": ["rename", course, term.exchange / "stolen"],
        "delete the course folder": ["rmdir", course],
        "the course root": ["list", root],
        "solutions": ["list", term.clone / "solutions"],
        "the gradebook": ["read", root / "gradebook.db"],
        "autograded": ["list", root / "autograded"],
        "submitted": ["read", root / "submitted" / bob / CHAPTER / f"{CHAPTER}.ipynb"],
        "B's fetched feedback": ["list", term.work("bob") / "feedback"],
    }  # fmt: skip
    allowed = {
        "A's notebook": ["read", term.work("alice") / f"{CHAPTER}.ipynb"],
        "A's home": ["list", Users.home(alice)],
        "a course folder without the sticky bit": [
            "rename", control / COURSE, control / "stolen",
        ],
    }  # fmt: skip
    assert bob_submission.is_dir()  # it exists: A just cannot find or read it
    plan = [[name, *map(str, how)] for name, how in {**denied, **allowed}.items()]
    run = term.users.run(alice, sys.executable, "-c", PROBE, json.dumps(plan))
    tried = json.loads(run.stdout)
    refused = {os.strerror(errno.EACCES), os.strerror(errno.EPERM)}
    assert {n: tried[n] for n in denied if tried[n] not in refused} == {}
    assert {n: tried[n] for n in allowed} == dict.fromkeys(allowed, "allowed")


# --- each student's feedback page, as they open it: 1280 x 800, no network ------------

PAGE = r"""
const clipped = (el) => {
  const box = el.getBoundingClientRect();
  return {
    right: box.right, left: box.left, width: innerWidth,
    scrollWidth: el.scrollWidth, clientWidth: el.clientWidth,
  };
};
const deepest = (text) => [...document.querySelectorAll('body *')].filter(
  (el) => el.textContent.includes(text)
    && ![...el.children].some((c) => c.textContent.includes(text)));
const score = deepest('(Score:')[0];
const mistakes = deepest('Likely mistake').map((el) => {
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  let node; while ((node = walker.nextNode())) {
    const at = node.data.indexOf('Likely mistake');
    if (at >= 0) { range.setStart(node, at); range.setEnd(node, node.data.length); break; }
  }
  return {...clipped(el), textRight: range.getBoundingClientRect().right};
});
const markdown = [...document.querySelectorAll('.text_cell_render, .jp-MarkdownOutput')];
return {
  score: score ? {...clipped(score), text: score.textContent.trim()} : null,
  mistakes,
  typeset: document.querySelectorAll('math').length,  // MathML, written with the page
  raw_math: markdown.map((el) => el.innerText).join('\n')
    .match(/\$[^$\n]+\$|\\\(|\\\[/g) || [],
  text: document.body.innerText,
};
"""


@pytest.fixture(scope="module")
def pages(term):
    """Each student's fetched feedback page, measured in one headless Chromium."""
    from tests.browser import Browser

    browser = Browser(timeout=60)
    measured = {}
    try:
        for role in term.students:
            page, visit = browser.open(term.feedback_page(role).as_uri())
            try:
                page.set_viewport_size({"width": 1280, "height": 800})
                measured[role] = page.evaluate(f"() => {{ {PAGE} }}")
                measured[role]["failed"] = visit.failed
            finally:
                page.context.close()
    finally:
        browser.close()
    return measured


def _inside(box: dict) -> bool:
    return (
        box["left"] >= 0
        and box["right"] <= box["width"]
        and box["scrollWidth"] <= box["clientWidth"]
    )


def test_feedback_pages_show_the_score_within_the_width(pages):
    for role, score in [("alice", 10), ("bob", 2), ("carol", 0)]:
        shown = pages[role]["score"]
        assert shown and f"Score: {score:.1f} / 10.0" in shown["text"], (role, shown)
        assert _inside(shown), (role, shown)
    assert "Late submission penalty (Score: -10.0)" in pages["carol"]["text"]


def test_feedback_names_the_mistake_within_the_width(pages):
    mistakes = pages["bob"]["mistakes"]
    assert mistakes, "B's page does not name the unscaled-scores mistake"
    assert any("unscaled" in pages["bob"]["text"] for _ in mistakes)
    for box in mistakes:
        assert _inside(box) and box["textRight"] <= box["width"], box
    assert not pages["alice"]["mistakes"]


def test_feedback_math_is_typeset_offline(pages):
    for role, page in pages.items():
        assert page["typeset"] > 0 and not page["raw_math"], (
            role, page["typeset"], page["raw_math"][:5], page["failed"],
        )  # fmt: skip
        assert page["failed"] == [], role  # it asked the network for nothing


def test_feedback_pages_hold_no_hidden_test_code(term):
    hidden = [
        line.strip()
        for cell in source_notebook(CHAPTER).cells
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade")
        for line in cell.source.splitlines()
        if len(line.strip()) > 12 and not line.strip().startswith("#")
    ]
    assert hidden and any("run_hidden_test" in line for line in hidden)
    for role in term.students:
        page = term.feedback_page(role).read_text()
        text = html.unescape(re.sub(r"<[^>]+>", "", page))
        assert [line for line in hidden if line in page or line in text] == [], role

"""Grading on submit (``python -m autograder serve-submissions``): a temp course and
exchange, real chapter-3 notebooks submitted with nbgrader's own ``submit`` (its
exchange classes, in this process: the app's seconds of start-up left out), the
service run ``--once`` (the service was down while they came: each run is a restart)
and the pages fetched with ``fetch_feedback``, the same way. One course for the module: its
submissions are made and graded once, and each test checks one promise of the result.
The rules alone (attempts, cool-down, keep): the first tests, no grading."""

import json
import os
import pwd
import re
import sqlite3
import subprocess
import sys
import time
from datetime import datetime

import pytest

from autograder import paths
from autograder.on_submit import attempts, settings
from tests.notebooks import (
    class_course,
    release_notebook,
    student_notebook,
    user_environment,
    with_extra_cell,
    write,
)

CH = "03_self_attention"
COURSE = "attention-course"
# logins every Linux has; submissions are made as root and given to them (as a
# student's own `nbgrader submit` leaves them), one is left root's: another's name
ANN, BEN, CAL, DEE = "daemon", "bin", "sys", "mail"
WRONG = lambda s: s.replace(" / math.sqrt(d_k)", "")  # noqa: E731 (a plausible slip)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0
    or any(u not in {p.pw_name for p in pwd.getpwall()} for u in (ANN, BEN, CAL, DEE)),
    reason="gives submissions to other logins: needs root, and daemon, bin, sys, mail",
)


# --- the rules ----------------------------------------------------------------------

P3 = settings.Policy(attempts=3, cooldown_minutes=0, keep="best", due=None)
T = datetime(2026, 1, 14, 10)


def _entry(n, score, state="graded", minute=0):
    return {"submission": f"s{n}", "attempt": n, "state": state, "score": score,
            "max_score": 10.0, "timestamp": f"2026-01-14 10:{minute:02d}:00"}  # fmt: skip


def test_the_fourth_of_three_is_held_until_the_due_date_then_graded():
    three = [_entry(n, 5) for n in (1, 2, 3)]
    due = datetime(2026, 1, 20)
    held = attempts.decide(three, T, P3, due, now=T)
    assert not held.grade and "used your 3 graded attempt(s)" in held.why_held
    assert "2026-01-20 00:00 UTC" in held.why_held
    after = attempts.decide(three, T, P3, due, now=datetime(2026, 1, 21))
    assert after.grade and after.number == 4
    assert attempts.decide(three[:2], T, P3, due, now=T).number == 3


def test_a_cooldown_holds_an_attempt_that_comes_too_soon():
    policy = settings.Policy(attempts=0, cooldown_minutes=30, keep="last", due=None)
    first = [_entry(1, 5)]
    soon = attempts.decide(first, datetime(2026, 1, 14, 10, 10), policy, None, T)
    assert not soon.grade and "from 2026-01-14 10:30:00 UTC" in soon.why_held
    later = attempts.decide(first, datetime(2026, 1, 14, 10, 31), policy, None, T)
    assert later.grade and later.number == 2
    assert attempts.left(policy, 5) == "no limit on graded attempts"
    assert attempts.left(P3, 2) == "1 graded attempt left of 3"
    assert attempts.left(P3, 3) == "0 graded attempts left of 3"


def test_keep_last_or_best_and_why():
    history = [
        _entry(1, 4),
        _entry(2, 9),
        _entry(3, 9),
        _entry(4, 2),
        _entry(5, 0, "held"),
    ]
    pick, why = attempts.chosen(history, "last")
    assert pick["attempt"] == 4 and why.startswith("keep=last")
    pick, why = attempts.chosen(history, "best")
    assert pick["attempt"] == 3 and "highest score (9 of 10) of 4 graded" in why


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"attempts": -1}, "'attempts'] must be a whole number"),
        ({"attempts": 2, "keep": "first"}, "'keep'] must be one of"),
        ({"cooldown_minutes": "5"}, "'cooldown_minutes'] must be a number"),
        ({"tries": 2}, "unknown key(s) ['tries']"),
        ({"due": "next friday"}, "write it as 'YYYY-MM-DD HH:MM:SS'"),
        (3, "must be a dict"),
    ],
)
def test_settings_are_checked_with_a_clear_message(entry, says):
    with pytest.raises(settings.SettingsError, match=re.escape(says)):
        settings.policy(CH, entry)


def _config(root, rules):
    root.mkdir(parents=True, exist_ok=True)
    (root / "nbgrader_config.py").write_text(
        (paths.COURSE_ROOT / "nbgrader_config.py").read_text()
        + f"\nc.GradeOnSubmit.assignments = {rules!r}\n"
    )


@pytest.mark.parametrize(
    "rule, says",
    [
        ({"attempts": 3, "keep": "best"}, "('attempts': 3)"),
        ({"cooldown_minutes": 60}, "('cooldown_minutes': 60)"),
    ],
)
def test_an_entry_that_holds_attempts_needs_a_due_date(tmp_path, rule, says):
    """Held until a due date that never comes would be held for ever: an entry that can
    hold attempts back, with no due date in it nor in the gradebook, is refused when the
    settings are read, and the message says what to add; with either, it is taken."""
    _config(tmp_path, {CH: rule})
    with pytest.raises(settings.SettingsError) as refused:
        settings.load(tmp_path)
    message = str(refused.value)
    assert says in message and "add a 'due' to its entry" in message, message
    assert f"nbgrader db assignment add {CH} --duedate" in message
    _config(tmp_path, {CH: {**rule, "due": "2026-02-01 23:59:00"}})
    assert settings.load(tmp_path)[CH].due == datetime(2026, 2, 1, 23, 59)
    _config(tmp_path, {CH: {"attempts": 0, "cooldown_minutes": 0}})  # holds nothing
    assert settings.load(tmp_path)[CH].due is None
    # the gradebook's due date is enough
    from nbgrader.api import Gradebook

    _config(tmp_path, {CH: rule})
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", COURSE) as gb:
        gb.add_assignment(CH, duedate=datetime(2026, 3, 1, 12))
    assert settings.due_date(tmp_path, CH, settings.load(tmp_path)[CH]) == datetime(
        2026, 3, 1, 12
    )


def test_the_guides_entries_are_valid_as_written(tmp_path):
    """Every ``c.GradeOnSubmit.assignments`` the instructor guide shows is read by the
    service as written, with no gradebook (a course root just set up)."""
    guide = (paths.REPO / "book" / "instructor_guide.md").read_text()
    blocks = re.findall(r"```python\n(c\.GradeOnSubmit\.assignments = .*?)```", guide,
                        re.S)  # fmt: skip
    assert blocks
    for block in blocks:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        root.mkdir()
        (root / "nbgrader_config.py").write_text(
            (paths.COURSE_ROOT / "nbgrader_config.py").read_text() + "\n" + block
        )
        policies = settings.load(root)
        assert policies and all(p.due is not None for p in policies.values()), block


def test_a_held_page_names_the_date():
    three = [_entry(n, 5) for n in (1, 2, 3)]
    due = datetime(2026, 1, 20, 23, 59)
    held = attempts.decide(three, T, P3, due, now=T)
    assert "after the due date (2026-01-20 23:59 UTC)" in held.why_held


# --- the service, end to end ---------------------------------------------------------


def _nbgrader(course, student, step, chapter=CH):
    """nbgrader's own exchange step (``submit``, ``fetch_feedback``) as ``student`` runs
    it from their home (their cache there); in this process, as nbgrader's app would."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.exchange.default.fetch_feedback import ExchangeFetchFeedback
    from nbgrader.exchange.default.submit import ExchangeSubmit
    from traitlets.config import Config

    home = course.dir / student
    (home / chapter).mkdir(parents=True, exist_ok=True)
    config = Config()
    config.Exchange.root, config.Exchange.cache = (
        str(course.exchange),
        str(home / "cache"),
    )
    config.Exchange.assignment_dir = str(home)
    config.CourseDirectory.root, config.CourseDirectory.course_id = str(home), COURSE
    config.CourseDirectory.assignment_id, config.CourseDirectory.student_id = (
        chapter,
        student,
    )
    kind = {"submit": ExchangeSubmit, "fetch_feedback": ExchangeFetchFeedback}[step]
    kind(
        coursedir=CourseDirectory(config=config),
        authenticator=Authenticator(config=config),
        config=config,
    ).start()


class Course:
    """The course root, its exchange, and each student's home (their nbgrader cache)."""

    def __init__(self, tmp, chapters=(CH,)):
        self.root = class_course(tmp / "course", CH, {})
        self.chapters = chapters
        self.exchange, self.cache, self.dir = (
            tmp / "exchange",
            tmp / "cache",
            tmp / "home",
        )
        for chapter in chapters:
            outbound = self.exchange / COURSE / "outbound" / chapter
            outbound.mkdir(parents=True)
            write(release_notebook(chapter), outbound / f"{chapter}.ipynb")
        inbound = self.exchange / COURSE / "inbound"
        inbound.mkdir()
        inbound.chmod(0o2733)
        self.logs = []
        self.configure(due="2099-01-01 00:00:00")

    def configure(self, due):
        config = self.root / "nbgrader_config.py"
        text = config.read_text().split("# on submit\n")[0]
        rule = {"attempts": 3, "cooldown_minutes": 0, "keep": "best", "due": due}
        rules = dict.fromkeys(self.chapters, rule)
        config.write_text(
            f"{text}# on submit\nc.Exchange.root = {str(self.exchange)!r}\n"
            f"c.GradeOnSubmit.assignments = {rules!r}\n"
        )

    def submit(self, named, nb, owner=None, chapter=CH):
        """``nbgrader submit --student NAMED`` as ``owner`` (default: NAMED) leaves it."""
        (self.dir / named / chapter).mkdir(parents=True, exist_ok=True)
        write(nb, self.dir / named / chapter / f"{chapter}.ipynb")
        before = set((self.exchange / COURSE / "inbound").iterdir())
        _nbgrader(self, named, "submit", chapter)
        (new,) = set((self.exchange / COURSE / "inbound").iterdir()) - before
        uid = pwd.getpwnam(owner or named).pw_uid
        for path in (new, *new.iterdir()):
            os.chown(path, uid, uid)
        time.sleep(1.0)  # a second apart: nbgrader's timestamps tell them apart
        return new

    def serve(self, cell_timeout=15):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "autograder", "serve-submissions", "--once",
             "--course-dir", str(self.root), "--jobs", "2",
             "--cell-timeout", str(cell_timeout)],
            capture_output=True, text=True, timeout=400,
            env=user_environment(PYTHONPATH=str(paths.REPO)),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        self.logs.append(done.stderr)
        return time.perf_counter() - started

    def pages(self, student) -> dict[str, str]:
        """``nbgrader fetch_feedback`` for ``student``: each submission's page by time."""
        _nbgrader(self, student, "fetch_feedback")
        found = {}
        for page in (self.dir / student / CH / "feedback").glob(f"*/{CH}.html"):
            found[page.parent.name] = page.read_text()
        return found

    def journal(self):
        path = self.root / "on_submit" / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def provenance(self, student):
        with sqlite3.connect(self.root / "gradebook.db") as db:
            row = db.execute(
                "SELECT attempt FROM autograder_provenance WHERE student = ?",
                (student,),
            ).fetchone()
        return json.loads(row[0])


def _score(root, student, chapter=CH):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE) as gb:
        return gb.find_submission(chapter, student).score


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """Submitted while the service was down, then served: dee's, a cell that never
    ends (the service's cell time limit: 15 s); ben's one; ann's 1st attempt right, her
    2nd and 3rd wrong, her 4th (right) beyond the limit; one of ben's in cal's name.
    Then the due date passes, ben submits again and the service is killed mid-grade
    (its journal says "started"); it comes back and grades what is left."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    c = Course(tmp_path_factory.mktemp("on_submit"))
    endless = with_extra_cell(student_notebook(CH), "while True:\n    pass",
                              "exercise_causal_mask")  # fmt: skip
    c.dee = c.submit(DEE, endless)
    c.ben = [c.submit(BEN, student_notebook(CH))]
    c.ann = [c.submit(ANN, student_notebook(CH))]
    c.ann += [c.submit(ANN, student_notebook(CH, WRONG)) for _ in range(2)]
    c.cal = c.submit(CAL, student_notebook(CH, WRONG), owner="root")
    c.ann.append(c.submit(ANN, student_notebook(CH)))
    c.first_run = c.serve()
    c.ann_before_due = c.pages(ANN)
    c.score_before_due = _score(c.root, ANN)
    c.provenance_before_due = c.provenance(ANN)
    c.configure(due="2020-01-01 00:00:00")  # the due date has passed
    c.ben.append(c.submit(BEN, student_notebook(CH, WRONG)))
    with open(c.root / "on_submit" / "journal.jsonl", "a") as journal:  # a crash
        journal.write(json.dumps({"submission": c.ben[1].name, "state": "started",
                                  "attempt": 2, "student": BEN, "assignment": CH,
                                  "timestamp": "2026-01-14 10:00:00"}) + "\n")  # fmt: skip
    c.serve()
    c.ann_after_due = c.pages(ANN)
    return c


@needs_root
def test_each_page_says_the_attempt_and_how_many_are_left(course):
    pages = course.ann_before_due
    assert len(pages) == 4, sorted(pages)
    ordered = [pages[t] for t in sorted(pages)]
    for n, left in ((1, "2 graded attempts left"), (2, "1 graded attempt left"),
                    (3, "0 graded attempts left")):  # fmt: skip
        page = ordered[n - 1]
        assert f"Attempt {n} (submitted" in page and f"{left} of 3" in page
        assert "hidden tests" in page  # the course's own feedback page
    assert (
        "(Score: 10.0 / 10.0)" in ordered[0]
        and "(Score: 10.0 / 10.0)" not in ordered[1]
    )
    held = ordered[3]
    assert "received and kept, not graded now" in held
    assert "you have used your 3 graded attempt(s)" in held
    assert "after the due date (2099-01-01 00:00 UTC)" in held
    assert "0 graded attempts left of 3" in held


@needs_root
def test_beyond_the_limit_is_graded_once_the_due_date_has_passed(course):
    fourth = [course.ann_after_due[t] for t in sorted(course.ann_after_due)][3]
    assert "Attempt 4 (submitted" in fourth and "(Score: 10.0 / 10.0)" in fourth
    graded = [e for e in course.journal() if e["state"] == "graded"]
    assert [e["submission"] for e in graded].count(course.ann[3].name) == 1


@needs_root
def test_a_students_attempts_are_graded_in_order_each_once(course):
    graded = [e["submission"] for e in course.journal() if e["state"] == "graded"]
    assert [s for s in graded if s.startswith(f"{ANN}+")] == [
        p.name for p in course.ann
    ]
    assert len(graded) == len(set(graded))
    # killed mid-grade: graded again on restart, and once
    assert graded.count(course.ben[1].name) == 1


@needs_root
def test_a_notebook_that_never_ends_holds_up_no_one_else(course):
    """dee's notebook came first and holds a worker for its whole time limit (15 s):
    ben's, which came next, is graded on the other worker and his feedback written
    before dee's notebook is even graded; dee's page comes once it is."""
    journal = course.journal()
    lines = [(e["submission"], e["state"]) for e in journal]
    assert lines.index((course.ben[0].name, "graded")) < lines.index(
        (course.dee.name, "verdict")
    )
    (verdict,) = [
        e for e in journal if e.get("result") and e["submission"] == course.dee.name
    ]
    assert "ran past its time limit and was interrupted" in verdict["result"]["message"]
    (page,) = course.pages(DEE).values()
    assert "Attempt 1 (submitted" in page


@needs_root
def test_the_gradebook_keeps_the_best_attempt_with_its_provenance(course):
    # before the due date: attempt 1 (10 of 10), not the later, wrong ones
    assert course.score_before_due == 10.0
    first = course.provenance_before_due
    # its time: when it reached the exchange, not the time in its name (the student's)
    from autograder.grading.recording.timestamps import arrived

    assert first["number"] == 1
    assert first["timestamp"] == arrived(course.ann[0]).strftime(attempts.TIME)
    assert (
        first["why"] == "keep=best: the highest score (10 of 10) of 3 graded attempt(s)"
    )
    assert re.fullmatch(r"[0-9a-f]{64}", first["sha256"])
    # after: attempt 4 ties it, and the latest of equals is kept
    last = course.provenance(ANN)
    assert last["number"] == 4 and "of 4 graded attempt(s)" in last["why"]
    # ben: his right first attempt, not his wrong second
    assert course.provenance(BEN)["number"] == 1 and _score(course.root, BEN) == 10.0


@needs_root
def test_a_submission_in_another_students_name_is_refused(course):
    log = course.logs[0]
    assert (
        f"REFUSED {course.cal}: it names {CAL} but is owned by root; not graded" in log
    )
    assert [e["state"] for e in course.journal()
            if e["submission"] == course.cal.name] == ["refused"]  # fmt: skip
    assert not (course.root / "submitted" / CAL).exists()
    assert course.pages(CAL) == {}


def test_a_grader_fault_uses_no_attempt(tmp_path):
    """An attempt the grader could not grade (``graded: False``) is not the student's
    grade: the page says so, and the next submission is still attempt 1 of 3."""
    from autograder.on_submit.inbound import Submission
    from autograder.on_submit.journal import Journal
    from autograder.on_submit.service import Service

    folder = (
        tmp_path / "exchange" / COURSE / "inbound" / f"ann+{CH}+2026-01-14 10:00:00+x"
    )
    folder.mkdir(parents=True)
    (folder / "submission_secret.txt").write_text("secret")
    (tmp_path / "exchange" / COURSE / "feedback").mkdir()
    sub = Submission(folder, "ann", CH, T)
    service = Service.__new__(Service)
    service.exchange, service.course_id = tmp_path / "exchange", COURSE
    service.journal = Journal(tmp_path / "course")
    service.journal.write(sub.key, "started", attempt=1, student="ann", assignment=CH,
                          timestamp="2026-01-14 10:00:00")  # fmt: skip
    fault = {"graded": False, "message": "grader fault: the kernel did not start"}
    service._not_counted(sub, fault, P3, 1)
    (page,) = (tmp_path / "exchange" / COURSE / "feedback").glob("*.html")
    text = page.read_text()
    assert "does not count as a graded attempt (3 graded attempts left of 3)" in text
    assert "the kernel did not start" in text
    history = service.journal.of("ann", CH)
    assert history[0]["state"] == "fault"
    assert attempts.decide(history, T, P3, None, now=T).number == 1
    assert attempts.chosen(history, "best") is None


@needs_root
def test_every_chapter_is_graded_on_submit(tmp_path):
    """Each chapter's filled-in notebook and untouched one, submitted with nbgrader's own
    ``submit`` and graded by one run of the service, started from a login shell's
    environment: full marks and zero."""
    from autograder.grading.judging.spec import load_chapter_tests
    from tests.notebooks import CHAPTERS

    c = Course(tmp_path, tuple(CHAPTERS))
    for chapter in CHAPTERS:
        c.submit(ANN, student_notebook(chapter), chapter=chapter)
        c.submit(BEN, release_notebook(chapter), chapter=chapter)
    c.serve(cell_timeout=60)
    merged = {}  # each submission's lines in the journal, the last state kept
    for entry in c.journal():
        key = entry["submission"]
        merged[key] = {**merged.get(key, {}), **entry}
    graded = {
        (e.get("assignment"), e.get("student")): e
        for e in merged.values()
        if e["state"] == "graded"
    }
    for chapter in CHAPTERS:
        full = load_chapter_tests(chapter).max_score
        for student, score in ((ANN, full), (BEN, 0)):
            assert (chapter, student) in graded, (chapter, student, c.logs[-1][-3000:])
            assert _score(c.root, student, chapter) == score, graded[chapter, student]

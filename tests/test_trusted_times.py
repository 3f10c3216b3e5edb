"""Times that decide points come from what the student cannot write (issue 59, item 5).

A submission's folder name (``student+assignment+time+random``) and its ``timestamp.txt``
are written by the submitting student's own nbgrader, so by the student: a name stamped
in the future would pass any cool-down, a ``timestamp.txt`` in the past would escape a
late penalty. The grading on submit service and the course's ``collect`` take the time
the submission reached the exchange instead (its files' change time, which no user can
set back: ``timestamps.arrived``), and the collected copy's ``timestamp.txt``, which
nbgrader's late penalty reads, says that time."""

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from autograder import paths
from autograder.grading.recording import timestamps
from autograder.on_submit import attempts, settings
from autograder.on_submit.inbound import waiting
from tests.notebooks import (
    class_course,
    gradebook_entries,
    student_notebook,
    user_environment,
    write,
)

CH = "03_self_attention"
COURSE = "attention-course"


def _now():
    return datetime.now(UTC).replace(tzinfo=None)


def _inbound_submission(inbound, student, stamped, notebook_text="{}"):
    """What a student's ``nbgrader submit`` leaves, with ``stamped`` as the time the
    student's side wrote, in the name and in ``timestamp.txt``; and the files' own
    times set to it as well (``touch -d``: anyone may set those)."""
    text = f"{stamped:%Y-%m-%d %H:%M:%S}.000000 UTC"
    folder = inbound / f"{student}+{CH}+{text}+{os.urandom(4).hex()}"
    folder.mkdir(parents=True)
    (folder / f"{CH}.ipynb").write_text(notebook_text)
    (folder / "timestamp.txt").write_text(text)
    (folder / "submission_secret.txt").write_text("secret")
    for path in (*folder.iterdir(), folder):
        os.utime(path, (stamped.timestamp(), stamped.timestamp()))
    return folder


def test_a_name_stamped_in_the_future_passes_no_cooldown(tmp_path):
    inbound = tmp_path / "inbound"
    before = _now()
    future = datetime(2099, 1, 1)
    folder = _inbound_submission(inbound, "ann", future)
    (sub,) = waiting(inbound, {CH})
    after = _now()
    # its time is when it arrived, not the name's nor the files' modification times
    assert before - timedelta(seconds=2) <= sub.timestamp <= after
    assert timestamps.arrived(folder) == sub.timestamp
    # a first graded attempt a minute ago, a cool-down of 30 minutes: held
    policy = settings.Policy(attempts=0, cooldown_minutes=30, keep="last",
                             due=datetime(2099, 6, 1))  # fmt: skip
    last = (before - timedelta(minutes=1)).strftime(attempts.TIME)
    history = [{"submission": "s1", "attempt": 1, "state": "graded", "score": 1.0,
                "max_score": 10.0, "timestamp": last}]  # fmt: skip
    decision = attempts.decide(history, sub.timestamp, policy, policy.due, _now())
    assert not decision.grade and "came within 30 minutes" in decision.why_held
    # what the name says would have passed it
    assert attempts.decide(history, future, policy, policy.due, _now()).grade
    # the journal's time, once the service has seen it, stays whatever is done later
    seen = datetime(2026, 1, 14, 10, 0, 0, 500000)
    (again,) = waiting(inbound, {CH}, lambda key: seen)
    assert again.timestamp == seen


def test_a_change_to_the_files_can_only_make_the_time_later(tmp_path):
    folder = _inbound_submission(tmp_path / "inbound", "ann", datetime(2020, 1, 1))
    first = timestamps.arrived(folder)
    time.sleep(0.05)
    os.utime(folder / "timestamp.txt", (0, 0))  # back to 1970: the change time is now
    assert timestamps.arrived(folder) > first


def test_a_backdated_timestamp_escapes_no_late_penalty(tmp_path):
    """A submission stamped 2020 by the student, made today, for an assignment due in
    2025: the course's ``collect`` writes today's time into the collected copy's
    ``timestamp.txt`` (and says the name's differs), and the class run records it
    late, with nbgrader's penalty (the course's: zero points)."""
    from nbgrader.api import Gradebook

    root = class_course(tmp_path / "course", CH, {})
    exchange = tmp_path / "exchange"
    inbound = exchange / COURSE / "inbound"
    nb = student_notebook(CH)
    write(nb, tmp_path / "answer.ipynb")
    before = _now()
    # student "root": the test's own login owns the files, as a student's own do
    _inbound_submission(
        inbound, "root", datetime(2020, 1, 1), (tmp_path / "answer.ipynb").read_text()
    )
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE) as gb:
        gb.add_assignment(CH, duedate=datetime(2025, 1, 1))
    env = user_environment(PYTHONPATH=str(paths.REPO))
    collect = subprocess.run(
        [sys.executable, "-m", "nbgrader", "collect", CH, f"--Exchange.root={exchange}"],
        cwd=root, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert collect.returncode == 0, collect.stderr[-3000:]
    assert "reached the exchange at" in collect.stderr, collect.stderr[-3000:]
    folder = root / "submitted" / "root" / CH
    from nbgrader.utils import parse_utc

    stamped = parse_utc((folder / "timestamp.txt").read_text())
    assert before - timedelta(seconds=2) <= stamped <= _now()
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "autograde", CH, "--course-dir", str(root)],
        cwd=paths.REPO, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (entry,) = gradebook_entries(root, CH, ["root"]).values()
    assert entry["timestamp"] == stamped
    # full marks before the penalty, all of them taken by it (nbgrader's score: raw)
    assert entry["total"] == 10.0 and entry["penalty"] == 10.0, entry
    assert "LATE" in run.stdout, run.stdout[-2000:]

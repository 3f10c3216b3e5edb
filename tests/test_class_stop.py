"""A class run stopped at any moment loses nothing and records nothing wrong (issue 39).

Real runs, real signals: Ctrl-C (SIGINT to the run's process group) while grading and
while recording, a scheduler's SIGTERM to a shard's process, and a hard kill (SIGKILL to
the whole run, sent by the run itself at a named moment: ``stop_points.py``) while
nbgrader writes the gradebook, the autograded notebook, a feedback page, and while shards
are merged. After each stop a plain rerun goes on; at the end every grade, autograded
notebook, feedback page and ``nbgrader export`` is the clean run's, each recorded once."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import nbformat
import pytest

from autograder import paths
from autograder.grading.recording import completion
from autograder.grading.recording.autograde import RECORD_AHEAD_AT_VARIABLE
from autograder.grading.recording.stop_points import STOP_AT
from tests.notebooks import (
    class_course,
    gradebook_entries,
    release_notebook,
    student_notebook,
    user_environment,
)

pytestmark = pytest.mark.slow
CHAPTER = "03_self_attention"
SUBMISSIONS = {
    "alice": lambda: student_notebook(CHAPTER),
    "bob": lambda: release_notebook(CHAPTER),
    "carol": lambda: student_notebook(
        CHAPTER, lambda s: s.replace(" / math.sqrt(d_k)", "")
    ),
    "dave": lambda: student_notebook(CHAPTER),
}
SCORES = {"alice": 10, "bob": 0, "carol": 4, "dave": 10}  # carol: charged once
TIMESTAMPS = dict.fromkeys(SUBMISSIONS, "2026-01-14 10:00:00.000000 UTC")


def _start(*args, stop_at=None, ahead_at=None):
    """``python -m autograder ARGS...`` in a process group of its own (a terminal's
    job, a scheduler's job step); ``ahead_at``: recording beside the grading starts
    once that many are graded (``autograde.RecordingAhead``; by default a class this
    small is recorded after the grading)."""
    env = user_environment(PYTHONPATH=str(paths.REPO))
    if stop_at:
        env[STOP_AT] = stop_at
    if ahead_at:
        env[RECORD_AHEAD_AT_VARIABLE] = str(ahead_at)
    return subprocess.Popen(
        [sys.executable, "-m", "autograder", *map(str, args)],
        cwd=paths.REPO, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _end(process, status):
    out, err = process.communicate(timeout=600)
    assert process.returncode == status, (process.returncode, out[-3000:], err[-5000:])
    return out, err


def _autograde(root, *more):
    return (
        "autograde",
        CHAPTER,
        "--seed",
        7,
        "--feedback",
        "--course-dir",
        root,
        *more,
    )


def _when(condition, process, timeout=300.0):
    """Wait until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None or condition(), process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _lines(path):
    """How many students a journal or results file has a whole line for."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    students = set()
    for line in lines:
        try:
            students.add(json.loads(line)["student"])
        except ValueError:
            continue  # cut short
    return len(students)


def _table(root, sql):
    with sqlite3.connect(root / "gradebook.db") as db:
        return db.execute(sql).fetchall()


def _gradebook(root):
    """Each student's gradebook entry (``gradebook_entries``), and how many rows
    nbgrader's and the grader's tables hold for them."""
    out = gradebook_entries(root, CHAPTER, SUBMISSIONS)
    for student, entry in out.items():
        for table in ("submitted_assignment", "autograder_provenance"):
            column = "student_id" if table == "submitted_assignment" else "student"
            entry[table] = _table(
                root, f"SELECT COUNT(*) FROM {table} WHERE {column} = '{student}'"
            )[0][0]
    return out


def _export(root):
    run = subprocess.run(
        [sys.executable, "-m", "nbgrader", "export"], cwd=root, capture_output=True,
        text=True, timeout=300, env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return (root / "grades.csv").read_text()


def _files(root, folder, suffix):
    return {
        p.relative_to(root / folder).as_posix(): p.read_text()
        for p in sorted((root / folder).glob(f"*/{CHAPTER}/*{suffix}"))
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The class graded, recorded and given feedback by one run nobody stopped."""
    root = class_course(
        tmp_path_factory.mktemp("clean") / "course", CHAPTER, SUBMISSIONS, TIMESTAMPS
    )
    _, err = _end(_start(*_autograde(root, "--jobs", 2)), 0)
    assert "SAWarning" not in err and "not in session" not in err, err[-3000:]
    assert not (root / "runs").exists()  # a completed run keeps no journal
    recorded = _gradebook(root)
    assert {s: r["total"] for s, r in recorded.items()} == SCORES
    return root, recorded, _export(root)


def _assert_as_clean(root, clean):
    clean_root, recorded, export = clean
    assert _gradebook(root) == recorded
    for student in SUBMISSIONS:  # one row per student in nbgrader's table and ours
        assert recorded[student]["submitted_assignment"] == 1
        assert recorded[student]["autograder_provenance"] == 1
    assert _export(root) == export
    assert _files(root, "feedback", ".html") == _files(clean_root, "feedback", ".html")
    for name, text in _files(root, "autograded", ".ipynb").items():
        nbformat.reads(text, as_version=4)  # whole, not half written
        assert text == _files(clean_root, "autograded", ".ipynb")[name], name
    marks = completion.read(root / "gradebook.db", CHAPTER)
    assert set(marks) == set(SUBMISSIONS)
    assert all(m["feedback_at"] for m in marks.values())


def test_a_class_run_stopped_at_every_moment_ends_with_every_grade_once(
    clean, tmp_path
):
    root = class_course(tmp_path / "course", CHAPTER, SUBMISSIONS, TIMESTAMPS)
    journal = root / "runs" / f"{CHAPTER}.jsonl"

    # killed hard right after the first verdict: it is kept, nothing is recorded
    _end(_start(*_autograde(root, "--jobs", 1), stop_at="graded:1"), -9)
    kept = _lines(journal)
    assert kept == 1 and not completion.read(root / "gradebook.db", CHAPTER)

    # killed while nbgrader writes bob's gradebook entry: the rest is graded, not
    # what was kept; alice is recorded; bob's half record (0 points) is no record
    _, err = _end(_start(*_autograde(root, "--jobs", 1), stop_at="gradebook:bob"), -9)
    assert (
        f"{kept} graded before a stop (kept), {len(SUBMISSIONS) - kept} to grade" in err
    )
    marks = completion.read(root / "gradebook.db", CHAPTER)
    assert set(marks) == {"alice"}
    assert _gradebook(root)["bob"]["submitted_assignment"] == 1  # the half record
    assert _lines(journal) == len(SUBMISSIONS)

    # killed half way through writing carol's autograded notebook, her scores saved:
    # it looks done to nbgrader, not to the rerun. Nothing is graded again.
    _, err = _end(_start(*_autograde(root, "--jobs", 1), stop_at="notebook:carol"), -9)
    assert "1 already recorded (1 without their feedback page yet" in err, err
    assert "3 graded before a stop (kept), 0 to grade" in err, err
    assert _gradebook(root)["carol"]["total"] == SCORES["carol"]
    notebook = root / "autograded" / "carol" / CHAPTER / f"{CHAPTER}.ipynb"
    with pytest.raises(Exception):  # noqa: B017 (half a notebook: any parse error)
        nbformat.read(notebook, as_version=4)
    assert "carol" not in completion.read(root / "gradebook.db", CHAPTER)

    # killed half way through bob's feedback page
    _, err = _end(_start(*_autograde(root, "--jobs", 1), stop_at="feedback:bob"), -9)
    assert "0 to grade" in err
    marks = completion.read(root / "gradebook.db", CHAPTER)
    assert marks["alice"]["feedback_at"] and not marks["bob"]["feedback_at"]

    # Ctrl-C while the two workers record: they end, the run says what is left
    before = completion.read(root / "gradebook.db", CHAPTER)

    def one_more_recorded():
        now = completion.read(root / "gradebook.db", CHAPTER)
        return run.poll() is not None or any(
            (mark["recorded_at"], mark["feedback_at"])
            != (before[s]["recorded_at"], before[s]["feedback_at"])
            if s in before
            else True
            for s, mark in now.items()
        )

    run = _start(*_autograde(root, "--jobs", 2))
    _when(one_more_recorded, run)
    if run.poll() is None:  # else it finished first: nothing to test here
        print("SIGINT while recording")
        os.killpg(run.pid, signal.SIGINT)
        _, err = _end(run, 130)
        assert "stopped by SIGINT while recording" in err, err[-3000:]
        assert "left to record" in err

    # the rerun records only what is left, grades nothing
    _, err = _end(_start(*_autograde(root, "--jobs", 2)), 0)
    assert "already recorded" in err and "0 to grade" in err, err[-3000:]
    assert "SAWarning" not in err
    assert not journal.exists()
    _assert_as_clean(root, clean)
    # once complete, a run finds nothing to do
    _, err = _end(_start(*_autograde(root, "--jobs", 2)), 0)
    assert f"{len(SUBMISSIONS)} already recorded, 0 to grade" in err


def _recorded(root):
    """The students whose recording completed (their completion mark), and what
    ``nbgrader export`` lists for each: a student's score, '' for none."""
    marks = completion.read(root / "gradebook.db", CHAPTER)
    rows = {}
    for line in _export(root).splitlines()[1:]:
        row = line.split(",")
        if row[0] == CHAPTER:
            rows[row[3]] = row[-2] if row[-2] else ""
    return set(marks), rows


def test_ctrl_c_and_sigterm_record_every_verdict_they_finished(clean, tmp_path):
    """Ctrl-C while grading (SIGINT to the run's process group, as a terminal sends
    it), then SIGTERM to the rerun's process alone (a scheduler's): each stop records in
    the gradebook every verdict it finished, with the completion mark the rerun
    checks, and says how many it recorded and how many are left; formgrader's gradebook
    and ``nbgrader export`` show them at once. The last run grades only what is left,
    and the end is the clean run's."""
    root = class_course(tmp_path / "course", CHAPTER, SUBMISSIONS, TIMESTAMPS)
    journal = root / "runs" / f"{CHAPTER}.jsonl"
    header = _export(root).splitlines()[0].split(",")
    assert header[3] == "student_id" and header[-2] == "score", header

    run = _start(*_autograde(root, "--jobs", 1))
    _when(lambda: _lines(journal) >= 1, run)
    os.killpg(run.pid, signal.SIGINT)
    _, err = _end(run, 130)
    kept = _lines(journal)
    assert 1 <= kept < len(SUBMISSIONS), err[-3000:]
    assert (
        re.search(
            f"stopped by SIGINT( while recording)?: {kept} verdict.s. finished", err
        )
        and f"{kept} recorded in the gradebook ({kept} of them now)" in err
        and f"{len(SUBMISSIONS) - kept} submission(s) left to grade" in err
    ), err[-3000:]
    recorded, exported = _recorded(root)
    assert len(recorded) == kept
    for student in recorded:  # the clean run's grade, and page
        assert float(exported[student]) == SCORES[student], exported
        assert _gradebook(root)[student] == clean[1][student]
        page = root / "feedback" / student / CHAPTER / f"{CHAPTER}.html"
        assert page.is_file()
    assert completion.read(root / "gradebook.db", CHAPTER).keys() == recorded

    run = _start(*_autograde(root, "--jobs", 1))
    _when(lambda: _lines(journal) >= kept + 1, run)
    run.send_signal(signal.SIGTERM)
    _, err = _end(run, 143)
    assert f"{kept} already recorded, 0 graded before a stop" not in err
    assert f"{kept} already recorded, " in err, err[-3000:]
    now = _lines(journal)
    stopped = re.search(
        f"stopped by SIGTERM( while recording)?: {now} verdict.s. finished", err
    )
    assert stopped, err[-3000:]
    # the last verdict may be finished as the run begins recording it: stopped there,
    # what is left to record is left to the rerun, which checks each mark
    recording = stopped.group(1) is not None
    written = kept if recording else now
    assert (
        f"{written} recorded in the gradebook ({written - kept} of them now)" in err
        and f"{now - written} left to record" in err
    ), err[-3000:]
    recorded, exported = _recorded(root)
    assert len(recorded) == written
    assert all(float(exported[s]) == SCORES[s] for s in recorded), exported

    _, err = _end(_start(*_autograde(root, "--jobs", 2)), 0)
    unrecorded = f"{now - written} graded before a stop (kept), " if recording else ""
    expected = (
        f"{written} already recorded, {unrecorded}{len(SUBMISSIONS) - now} to grade"
    )
    assert expected in err, err
    _assert_as_clean(root, clean)


def test_recorded_beside_the_grading_as_after_it_and_stopped_there(clean, tmp_path):
    """Recording beside the grading ends as the clean run, which recorded after it;
    stopped while it records, the rerun goes on from there."""
    root = class_course(tmp_path / "ahead" / "course", CHAPTER, SUBMISSIONS, TIMESTAMPS)
    out, err = _end(_start(*_autograde(root, "--jobs", 2), ahead_at=1), 0)
    assert re.search(r"; [1-4] of them recorded beside the grading", out), out
    assert "SAWarning" not in err
    _assert_as_clean(root, clean)

    root = class_course(tmp_path / "stop" / "course", CHAPTER, SUBMISSIONS, TIMESTAMPS)
    run = _start(*_autograde(root, "--jobs", 1), ahead_at=1)
    gradebook = root / "gradebook.db"
    _when(lambda: run.poll() is not None or completion.read(gradebook, CHAPTER), run)
    if run.poll() is None:  # else it finished first: nothing to test here
        print("SIGINT while recording beside the grading")
        os.killpg(run.pid, signal.SIGINT)
        _, err = _end(run, 130)
        assert "stopped by SIGINT" in err, err[-3000:]
    _end(_start(*_autograde(root, "--jobs", 2)), 0)
    _assert_as_clean(root, clean)


def test_a_stopped_shard_and_a_stopped_merge_go_on(clean, tmp_path):
    root = class_course(tmp_path / "course", CHAPTER, SUBMISSIONS, TIMESTAMPS)
    results = tmp_path / "shard-1.jsonl"
    partial = tmp_path / "shard-1.jsonl.partial"
    shard = ("autograde", CHAPTER, "--shard", "1/1", "--seed", 7, "--jobs", 1,
             "--course-dir", root, "--results", results)  # fmt: skip

    # killed hard right after its first verdict: that verdict is on disk
    _end(_start(*shard, stop_at="graded:1"), -9)
    assert _lines(partial) == 1 and not results.exists()

    # a scheduler's SIGTERM to the shard's process alone, after one more verdict
    run = _start(*shard)
    _when(lambda: _lines(partial) >= 2, run)
    run.send_signal(signal.SIGTERM)
    _, err = _end(run, 143)
    assert f"1 graded before a stop (kept), {len(SUBMISSIONS) - 1} to grade" in err
    assert "stopped by SIGTERM" in err, err[-3000:]
    assert not results.exists()  # merge never reads a stopped shard's results
    kept = _lines(partial)

    _, err = _end(_start(*shard), 0)
    assert (
        f"{kept} graded before a stop (kept), {len(SUBMISSIONS) - kept} to grade" in err
    )
    assert _lines(results) == len(SUBMISSIONS) and not partial.exists()

    # the merge killed while nbgrader writes carol's gradebook entry, then run again
    merge = ("merge", CHAPTER, results, "--jobs", 2, "--feedback", "--course-dir", root)
    _end(_start(*merge, stop_at="gradebook:carol"), -9)
    done = completion.read(root / "gradebook.db", CHAPTER)
    assert "carol" not in done
    _, err = _end(_start(*merge), 0)
    # recorded before the kill: only their pages are written, if they lack them
    assert f"{len(done)} already recorded" in err, err
    assert f", {len(SUBMISSIONS) - len(done)} to record" in err, err
    _assert_as_clean(root, clean)

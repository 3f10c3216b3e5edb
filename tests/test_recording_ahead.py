"""Recording beside the grading (``autograde.RecordingAhead``): what it hands a recording
worker and when, the order students enter the gradebook in, and what a fault or a stop
leaves. nbgrader's recording itself is stood in for here; that a class recorded this way
ends exactly as one recorded after the grading is ``tests/test_class_stop.py``'s check."""

import sqlite3
import subprocess
import threading
import time

import pytest
from nbgrader.api import Gradebook

from autograder.grading.nbgrader_bridge import COURSE_ID
from autograder.grading.recording import autograde as ag

# nbgrader's own warning on every new submission (the course config filters it)
pytestmark = pytest.mark.filterwarnings("ignore:Object of type <Submitted")
ASSIGNMENT = "a1"
CLASS = ["carol", "alice", "dave", "bob"]


class _Entering:
    def __init__(self, status: int = 0):
        self.status = status

    def result(self) -> int:
        return self.status


@pytest.fixture
def course(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text("")
    with Gradebook(_url(tmp_path), COURSE_ID) as gb:
        gb.add_assignment(ASSIGNMENT)
        gb.add_student("zed")  # entered by the instructor before: never removed
    return tmp_path


def _url(root) -> str:
    return f"sqlite:///{root / 'gradebook.db'}"


class _Worker:
    """Stands in for the recording worker that stays up (``RecordingWorker``)."""

    started: list["_Worker"] = []

    def __init__(self, root, nice: int):
        assert nice > 0  # at a lower priority than the grading
        self.process = subprocess.Popen(["sleep", "60"])
        self.closed = False
        _Worker.started.append(self)

    def close(self) -> int:
        self.closed = True
        self.process.kill()
        return self.process.wait()


@pytest.fixture
def recordings(monkeypatch):
    """Each recording handed over: the students, and the exit status to give back."""
    calls, status = [], {"next": 0, "release": None}
    _Worker.started = []
    monkeypatch.setattr(ag, "RecordingWorker", _Worker)

    def record(root, assignment, results, force, jobs, feedback, timings, **kw):
        calls.append(sorted(r["student"] for r in results))
        if status["release"] is not None:  # a recording that takes its time
            status["release"].wait(10)
        # one worker, the same for every run
        assert jobs == 1 and kw["worker"] is _Worker.started[-1]
        assert len(_Worker.started) == 1
        with Gradebook(_url(root), COURSE_ID) as gb:
            for r in results:
                if r["graded"]:
                    gb.add_submission(assignment, r["student"])
        return status["next"]

    monkeypatch.setattr(ag, "record", record)
    return calls, status


def _result(student: str, graded: bool = True) -> dict:
    return {"student": student, "graded": graded, "message": ""}


def _until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _students_in_order(root) -> list[str]:
    with sqlite3.connect(root / "gradebook.db") as db:
        return [r[0] for r in db.execute("SELECT id FROM student ORDER BY rowid")]


def test_students_enter_in_id_order_and_a_fault_leaves_no_student(course, recordings):
    calls, _ = recordings
    ahead = ag.RecordingAhead(course, ASSIGNMENT, CLASS, False, _Entering(), at=2)
    ahead.add(_result("dave"))
    time.sleep(0.2)
    assert calls == []  # fewer than ``at`` graded: nothing handed over yet
    ahead.add(_result("bob", graded=False))  # the grader could not grade his
    _until(lambda: len(calls) == 1)
    assert calls == [["bob", "dave"]]
    # every student of the run entered before the first recording, in id order
    assert _students_in_order(course) == ["zed", "alice", "bob", "carol", "dave"]
    ahead.add(_result("alice"))
    ahead.close()  # one graded since: fewer than ``at``, left to the run
    assert calls == [["bob", "dave"]]
    assert [w.closed for w in _Worker.started] == [True]  # its worker ended with it
    assert ahead.recorded == {"bob", "dave"} and ahead.previous == {}
    with Gradebook(_url(course), COURSE_ID) as gb:  # the run records the rest
        for student in ("alice", "carol"):
            gb.add_submission(ASSIGNMENT, student)
    ahead.tidy()
    assert _students_in_order(course) == ["zed", "alice", "carol", "dave"]


def test_nothing_recorded_where_the_assignment_could_not_be_entered(course, recordings):
    calls, _ = recordings
    ahead = ag.RecordingAhead(course, ASSIGNMENT, CLASS, False, _Entering(1), at=1)
    for student in CLASS:
        ahead.add(_result(student))
    ahead.close()
    assert calls == [] and ahead.recorded == set() and ahead.previous is None
    assert _students_in_order(course) == ["zed"] and _Worker.started == []


def test_a_stopped_recording_counts_for_no_student(course, recordings):
    """Its students are recorded again: after the grading, or by the next run."""
    calls, status = recordings
    status["next"] = 130  # the worker was stopped (SIGINT)
    ahead = ag.RecordingAhead(course, ASSIGNMENT, CLASS, False, _Entering(), at=1)
    ahead.add(_result("alice"))
    _until(lambda: len(calls) == 1)
    ahead.add(_result("bob"))
    ahead.close()
    assert calls == [["alice"]]  # takes nothing more once stopped
    assert ahead.recorded == set() and ahead.status == 0


def test_the_run_records_the_rest_beside_the_recording_under_way(course, recordings):
    calls, status = recordings
    status["release"] = threading.Event()
    ahead = ag.RecordingAhead(course, ASSIGNMENT, CLASS, False, _Entering(), at=1)
    ahead.add(_result("alice"))
    _until(lambda: len(calls) == 1)
    assert ahead.finish() == {"alice"}  # the run records everyone else meanwhile
    assert ahead.previous == {}  # read before alice was recorded
    ahead.add(_result("bob"))
    status["release"].set()
    ahead.close()
    assert calls == [["alice"]] and ahead.recorded == {"alice"}


def test_one_worker_records_every_run_and_a_stop_ends_it(course, recordings):
    calls, _ = recordings
    ahead = ag.RecordingAhead(course, ASSIGNMENT, CLASS, False, _Entering(), at=1)
    for student in ("alice", "bob", "carol"):
        ahead.add(_result(student))
        _until(lambda s=student: s in ahead.recorded)
    assert calls == [["alice"], ["bob"], ["carol"]] and len(_Worker.started) == 1
    worker = _Worker.started[0]
    assert worker.process.poll() is None  # up between runs
    ahead.stop()
    assert worker.process.poll() is not None  # ended by the stop

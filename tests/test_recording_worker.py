"""The recording worker that stays up (``nbgrader_steps --serve``, driven by
``autograde.RecordingWorker``): one request a line, one reply a line, each request's
results file in the environment nbgrader's recording reads, and a stop or a kill that the
run sees as one. That a class recorded this way ends as one recorded after the grading is
``tests/test_class_stop.py``'s check."""

import io
import json
import os
import signal

from autograder.grading.nbgrader_bridge import VERDICTS
from autograder.grading.recording import autograde as ag
from autograder.grading.recording import nbgrader_steps


def _serve(monkeypatch, requests: list[dict], statuses: list[int]):
    """``serve`` over ``requests`` with each run's status from ``statuses``: its exit
    status, the replies, and what each run was given."""
    runs = []

    def run_steps(argv):
        runs.append((argv, os.environ.get(VERDICTS)))
        return statuses[len(runs) - 1], [[argv[0], 0.5]]

    monkeypatch.setattr(nbgrader_steps, "run_steps", run_steps)
    monkeypatch.delenv(VERDICTS, raising=False)
    read, write = os.pipe()
    lines = io.StringIO("".join(json.dumps(r) + "\n" for r in requests))
    status = nbgrader_steps.serve(lines, write)
    with os.fdopen(read) as f:
        replies = [json.loads(line) for line in f]
    return status, replies, runs


def test_each_request_is_run_with_its_own_results_file(monkeypatch):
    requests = [
        {
            "argv": ["autograde", "a1", "--then", "generate_feedback", "a1"],
            "verdicts": "/x",
        },
        {"argv": ["autograde", "a1"], "verdicts": "/y"},
    ]
    status, replies, runs = _serve(monkeypatch, requests, [0, 1])
    assert status == 0  # the end of the requests
    assert runs == [(requests[0]["argv"], "/x"), (requests[1]["argv"], "/y")]
    assert replies == [
        {"status": 0, "timings": [["autograde", 0.5]]},
        {"status": 1, "timings": [["autograde", 0.5]]},  # one notebook unreadable
    ]


def test_a_stopped_request_ends_the_worker(monkeypatch):
    requests = [{"argv": ["autograde", "a1"], "verdicts": "/x"}] * 3
    status, replies, runs = _serve(monkeypatch, requests, [0, 130, 0])
    assert status == 130 and len(runs) == 2  # nothing runs after the stop
    assert [r["status"] for r in replies] == [0, 130]


def test_the_worker_answers_and_a_killed_one_says_so(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text("")
    worker = ag.RecordingWorker(tmp_path)
    try:  # a real worker: nbgrader's own app, run in it for each request
        status, timings = worker.run(["--version"], tmp_path / "verdicts.jsonl")
        assert status == 0 and [name for name, _ in timings] == ["--version"]
        assert worker.process.poll() is None  # up for the next request
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
        status, timings = worker.run(["--version"], tmp_path / "verdicts.jsonl")
        assert (status, timings) == (128 + signal.SIGKILL, [])
    finally:
        worker.close()
    assert worker.close() == 128 + signal.SIGKILL  # closing twice says the same

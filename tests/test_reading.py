"""The student's code is read in a forked child under a memory and a time limit: the
same reading as in the grader's process, and a child past a limit is a flag for
review, never a crash or a point."""

import threading

from autograder.grading.judging import reading
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.running.student_code import StudentCode, given_sources
from tests.notebooks import answers

CHAPTER = "08_efficient_attention"


def _exercises():
    return [(t.exercise, t.forbidden) for t in load_chapter_tests(CHAPTER).tests]


def _softmax_in_the_tiles():
    cells = list(answers(CHAPTER).values())
    cells.append(
        "import torch\ndef flash_attention(q, k, v, block_size=64, causal=False):\n"
        "    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v\n"
    )
    return StudentCode(cells, given_sources(CHAPTER))


def test_the_child_reads_what_the_grader_would():
    code = _softmax_in_the_tiles()
    apart = reading.read(code, _exercises(), CHAPTER)
    here = reading.read_in_process(code, _exercises(), CHAPTER)
    assert apart == here
    assert any(r.startswith("Remark on your code") for r in apart.remarks.values())


def test_a_child_past_its_memory_is_a_flag(monkeypatch):
    monkeypatch.setattr(reading, "BUDGET_MB", 0)
    code = _softmax_in_the_tiles()
    big = "numbers = [" + ",".join(["1"] * 1_500_000) + "]\n"  # ~500 MB parsed
    code = StudentCode([*code.cells, big], code.given)
    found = reading.read(code, _exercises(), CHAPTER)
    assert found.flags == [reading.UNREAD.format("memory")], found.flags
    assert found.remarks == {}


def test_a_child_past_its_time_is_a_flag(monkeypatch):
    monkeypatch.setattr(reading, "SECONDS", 0.0)
    monkeypatch.setattr(reading, "read_in_process", _sleeps)
    found = reading.read(_softmax_in_the_tiles(), _exercises(), CHAPTER)
    assert found.flags and "within its limits" in found.flags[0], found.flags


def _sleeps(*args):
    threading.Event().wait(30)


def test_threads_reading_at_once_each_get_their_own_reading():
    code, results = _softmax_in_the_tiles(), []

    def one():
        results.append(reading.read(code, _exercises(), CHAPTER))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r == results[0] for r in results)

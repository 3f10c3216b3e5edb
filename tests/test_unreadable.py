"""Files that are not usable notebooks get a zero, the assignment's max_score and a message."""

import json

import pytest

from autograder.grading.grade import grade_notebook

CHAPTER = "03_self_attention"

BROKEN = {
    "empty.ipynb": b"",
    "binary.ipynb": bytes(range(256)) * 4,
    "json_list.ipynb": json.dumps([1, 2, 3]).encode(),
    "no_cells.ipynb": json.dumps(
        {"nbformat": 4, "nbformat_minor": 5, "metadata": {}}
    ).encode(),
    "cells_not_cells.ipynb": json.dumps(
        {"cells": [1, "two"], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    ).encode(),
    "truncated.ipynb": b'{"cells": [{"cell_type": "code", "source": "def scaled_dot',
}


@pytest.mark.parametrize("name", sorted(BROKEN))
@pytest.mark.parametrize("assignment", [CHAPTER, None])
def test_broken_file_gets_a_message_not_a_crash(tmp_path, name, assignment):
    path = tmp_path / name
    path.write_bytes(BROKEN[name])
    result = grade_notebook(path, assignment, seed=0)
    assert result["score"] == 0.0
    assert "could not read the notebook" in result["message"]
    if assignment:
        assert result["max_score"] == 10.0 and len(result["tests"]) == 6
        assert all(not t["passed"] for t in result["tests"])


def test_notebook_of_another_course_is_not_recognised(tmp_path):
    path = tmp_path / "other.ipynb"
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": "def f(x):\n    return x",
                "outputs": [],
                "execution_count": None,
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 4,
    }
    path.write_text(json.dumps(nb))
    result = grade_notebook(path, None, seed=0)
    assert (
        result["assignment"] is None
        and "could not recognise the chapter" in result["message"]
    )


def test_a_parser_fault_is_no_grade(tmp_path, monkeypatch):
    """CPython 3.11's ast.parse fails at random ("AST constructor recursion depth
    mismatch") when two threads parse at once. The workers take turns
    (``delegation.READING_CODE``), and should the parser still fail, that is the grader's
    fault: no grade, never the zero of an unreadable file."""
    from autograder.grading import grade
    from tests.notebooks import student_notebook, write

    def fails(nb):
        raise SystemError("AST constructor recursion depth mismatch")

    monkeypatch.setattr(grade, "_fingerprint", fails)
    path = write(student_notebook(CHAPTER), tmp_path / "right.ipynb")
    result = grade_notebook(path, CHAPTER, 0, sandbox=grade.Unsandboxed())
    assert not result["graded"] and "grader failed reading" in result["message"]

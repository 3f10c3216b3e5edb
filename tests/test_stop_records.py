"""What a stopped class run keeps and how the next one reads it, without running one
(the real stops are in tests/test_class_stop.py): the journal of verdicts, the
completion marks, and which students a rerun records again."""

import json
import sqlite3

from autograder.grading.recording import completion
from autograder.grading.recording.autograde import (
    Journal,
    _limits_key,
    plan,
    recorded_already,
)
from autograder.grading.recording.provenance import assignment_digest
from autograder.grading.running.limits import Limits
from autograder.paths import course_version

CHAPTER = "03_self_attention"


def _submit(root, student, text="{}"):
    folder = root / "submitted" / student / CHAPTER
    folder.mkdir(parents=True)
    path = folder / f"{CHAPTER}.ipynb"
    path.write_text(text)
    return path


def _result(student, notebook, **more):
    return {
        "student": student, "assignment": CHAPTER, "graded": True, "seed": 7,
        "score": 10.0, "max_score": 10.0, "digest": assignment_digest(CHAPTER),
        "course_version": course_version(), "limits": _limits_key(Limits()),
        "submission_sha256": completion.sha256(notebook), "result_id": student + "-1",
    } | more  # fmt: skip


def test_the_journal_keeps_verdicts_that_still_hold_and_skips_a_cut_line(tmp_path):
    notebooks = {s: _submit(tmp_path, s) for s in ("alice", "bob", "carol", "dave")}
    journal = Journal(tmp_path / "runs" / f"{CHAPTER}.jsonl")
    journal.start([_result("alice", notebooks["alice"])])
    journal.append(_result("bob", notebooks["bob"], digest="0" * 64))  # other tests
    journal.append(_result("carol", notebooks["carol"], graded=False))  # grader fault
    journal.close()
    line = json.dumps(_result("dave", notebooks["dave"]))
    with open(journal.path, "a") as f:
        f.write(line[: len(line) // 2])  # a kill mid-line
    assert set(journal.load()) == {"alice", "bob", "carol"}
    assert set(journal.kept(notebooks, CHAPTER, None, Limits())) == {"alice"}
    assert journal.kept(notebooks, CHAPTER, 8, Limits()) == {}  # another --seed
    assert journal.kept(notebooks, CHAPTER, None, Limits(cell=1)) == {}  # other limits
    notebooks["alice"].write_text('{"changed": 1}')  # resubmitted
    assert journal.kept(notebooks, CHAPTER, None, Limits()) == {}
    journal.discard()
    assert not journal.path.exists() and not journal.path.parent.exists()


def test_a_student_without_a_completion_mark_is_recorded_again(tmp_path):
    notebooks = {s: _submit(tmp_path, s) for s in ("alice", "bob", "carol")}
    for student in notebooks:  # nbgrader's autograded copies: all look done to it
        done = tmp_path / "autograded" / student / CHAPTER
        done.mkdir(parents=True)
        (done / f"{CHAPTER}.ipynb").write_text("{}")
    db = tmp_path / "gradebook.db"
    sqlite3.connect(db).close()
    completion.mark_recorded(
        db, CHAPTER, "alice", completion.sha256(notebooks["alice"]), "alice-1"
    )
    completion.mark_recorded(db, CHAPTER, "bob", None, "bob-1")
    completion.clear(db, CHAPTER, "bob")  # bob's recording began, never ended
    to_record, already, pages = plan(tmp_path, CHAPTER, None, False, False, {})
    assert set(to_record) == {"bob", "carol"} and already == ["alice"]
    # a result kept from a stopped --feedback run, recorded but without its page
    kept = {"alice": _result("alice", notebooks["alice"])}
    to_record, already, pages = plan(tmp_path, CHAPTER, None, True, True, kept)
    assert already == pages == ["alice"] and set(to_record) == {"bob", "carol"}
    completion.mark_feedback(db, CHAPTER, "alice", done=True)
    left, already, pages = recorded_already(
        tmp_path, CHAPTER, list(kept.values()), True
    )
    assert (left, already, pages) == ([], ["alice"], [])
    # another result for alice (a merge of other shards' files) is recorded again
    other = [_result("alice", notebooks["alice"], result_id="alice-2")]
    assert recorded_already(tmp_path, CHAPTER, other, True)[0] == other


def test_a_gradebook_from_before_the_marks_keeps_its_records(tmp_path):
    """Upgrading does not re-grade a term: the submissions recorded then (an autograded
    copy and a provenance row) are entered as recorded when the table is made."""
    _submit(tmp_path, "alice")
    _submit(tmp_path, "bob")
    done = tmp_path / "autograded" / "alice" / CHAPTER
    done.mkdir(parents=True)
    (done / f"{CHAPTER}.ipynb").write_text("{}")
    db = tmp_path / "gradebook.db"
    with sqlite3.connect(db) as con:
        con.execute(
            "CREATE TABLE autograder_provenance (assignment TEXT, student TEXT, "
            "course_version TEXT, digest TEXT, seed INTEGER, graded_at TEXT)"
        )
        con.executemany(
            "INSERT INTO autograder_provenance VALUES (?, ?, '1.0.0', 'x', 7, 'now')",
            [(CHAPTER, "alice"), (CHAPTER, "bob")],  # bob: no autograded copy
        )
    assert set(completion.read(db, CHAPTER)) == {"alice"}
    _, already, _ = plan(tmp_path, CHAPTER, None, False, False, {})
    assert already == ["alice"]

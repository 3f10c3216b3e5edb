"""Which students' recordings completed: the gradebook's table ``autograder_recorded``.

Recording one student takes several writes that a stop (Ctrl-C, a scheduler's SIGTERM, a
hard kill, a laptop's battery) can cut between: nbgrader enters the submission in the
gradebook, writes the sanitized notebook to ``autograded/``, the grader writes the
provenance and verdict rows, nbgrader saves the scores and the late penalty, writes the
autograded notebook again with the verdicts, and (``--feedback``) ``generate_feedback``
writes the page. Any prefix of these looks like a record to nbgrader (a submission row
with 0 points, an ``autograded/`` copy), and ``nbgrader autograde`` skips it as done.

So a student's row here is the one sign that a recording completed. nbgrader's hooks put
it there (``autograder/course/nbgrader_config.py``, ``nbgrader_bridge``):

- before nbgrader touches a student (``pre_convert_hook``), the row is deleted;
- after nbgrader finished the student, every write above done (``post_convert_hook``, run
  only when the whole conversion succeeded), the row is written: the submitted
  notebook's sha256 and the id of the result recorded (``result_id``: the line of the
  class run's results it came from);
- ``generate_feedback`` likewise clears ``feedback_at`` before it writes a student's page
  and sets it once the page is written.

``python -m autograder autograde`` and ``merge`` take a submission as recorded only when
its row is here, for the same notebook (and, for a result kept from a stopped run, the same
result); any other is recorded again (``autograde.plan``).

A gradebook recorded before this table existed has none: :func:`ensure` creates it and
enters, once, every submission that was taken as done before (an ``autograded/`` copy
and a provenance row), so that upgrading does not re-grade a whole term.
"""

from __future__ import annotations

import hashlib
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

TABLE = "autograder_recorded"


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def submitted_notebook(root: Path, assignment: str, student: str) -> Path:
    return root / "submitted" / student / assignment / f"{assignment}.ipynb"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _connect(path: Path) -> sqlite3.Connection:
    # several recording workers write at once: wait for the others' short writes
    return sqlite3.connect(path, timeout=60, isolation_level=None)


def ensure(path: Path) -> None:
    """Create the table if the gradebook lacks it, entering the submissions recorded
    before it existed (an ``autograded/`` copy and a provenance row: what was taken as
    done then) as recorded."""
    from autograder.grading.recording.provenance import TABLE as PROVENANCE

    with _connect(path) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            exists = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                (TABLE,),
            ).fetchone()
            if not exists:
                db.execute(
                    f"CREATE TABLE {TABLE} (assignment TEXT NOT NULL, "
                    "student TEXT NOT NULL, submission_sha256 TEXT, result_id TEXT, "
                    "recorded_at TEXT, feedback_at TEXT, "
                    "PRIMARY KEY (assignment, student))"
                )
                _enter_earlier(db, Path(path).parent, PROVENANCE)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


def _enter_earlier(db, root: Path, provenance: str) -> None:
    try:
        rows = db.execute(f"SELECT assignment, student FROM {provenance}").fetchall()
    except sqlite3.OperationalError:  # no provenance table: nothing graded here yet
        return
    for assignment, student in rows:
        done = root / "autograded" / student / assignment / f"{assignment}.ipynb"
        if done.is_file():
            db.execute(
                f"INSERT OR IGNORE INTO {TABLE} VALUES (?, ?, ?, NULL, ?, NULL)",
                (
                    assignment,
                    student,
                    sha256(submitted_notebook(root, assignment, student)),
                    _now(),
                ),
            )


def clear(path: Path, assignment: str, student: str) -> None:
    """A recording of the student begins: until it completes, they are not recorded."""
    ensure(path)
    with _connect(path) as db:
        db.execute(
            f"DELETE FROM {TABLE} WHERE assignment = ? AND student = ?",
            (assignment, student),
        )


def mark_recorded(
    path: Path, assignment: str, student: str, sha: str | None, result_id: str | None
) -> None:
    """The student's recording completed (gradebook, autograded notebook, provenance)."""
    ensure(path)
    with _connect(path) as db:
        db.execute(
            f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?, ?, ?, NULL)",
            (assignment, student, sha, result_id, _now()),
        )


def mark_feedback(path: Path, assignment: str, student: str, done: bool) -> None:
    """The student's feedback page is being written (``done`` False) or was written."""
    ensure(path)
    with _connect(path) as db:
        db.execute(
            f"UPDATE {TABLE} SET feedback_at = ? WHERE assignment = ? AND student = ?",
            (_now() if done else None, assignment, student),
        )


def read(path: Path, assignment: str) -> dict[str, dict]:
    """``{student: row}`` of the students whose recording of ``assignment`` completed."""
    if not Path(path).is_file():
        return {}
    ensure(path)
    with sqlite3.connect(path, timeout=60) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            f"SELECT * FROM {TABLE} WHERE assignment = ?", (assignment,)
        ).fetchall()
    return {row["student"]: dict(row) for row in rows}

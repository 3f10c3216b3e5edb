"""Every submission's verdicts and attempts, kept in the gradebook for the class report.

nbgrader's gradebook holds a score per graded cell; the grader knows more: which known
mistake a failure matched, which route a refusal refused, why a notebook was not graded or
which limit it hit. Two tables beside nbgrader's own (like ``autograder_provenance``,
``provenance.py``) keep that, for ``python -m autograder report`` (``autograder/report``):

- ``autograder_verdicts``: one row per assignment, student and hidden test: the verdict
  as the feedback gave it (score, message) and its structured fields (``mistake``,
  ``refused``), written when a grade is recorded (``nbgrader_bridge``);
- ``autograder_attempts``: one row per assignment and student: the last attempt to grade
  the submission (graded, not graded, not autograded), the limits it hit and the grader's
  message (``autograde.record`` adds the attempts nbgrader never saw).

A re-grade replaces the student's rows. An attempt that records no grade leaves the
verdicts of the grade the gradebook still holds.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

VERDICTS = "autograder_verdicts"
ATTEMPTS = "autograder_attempts"
GRADED = "graded"
NOT_GRADED = "not graded"  # a grader fault: no grade recorded, grade it again
NOT_AUTOGRADED = "not autograded"  # nbgrader could not process the notebook

# The limits a graded submission can hit, by the words the grader's messages use for
# them (``grade._missing_reason``, ``grade._grade_notebook``, ``execute._problems``).
LIMIT_WORDS = {
    "time": ("past its time limit", "within its time limit"),
    "memory": ("more memory than the limit", "processes together held more than"),
    "output": ("printed more than",),
    "crash": ("the kernel died",),
}


def limits_hit(message: str) -> list[str]:
    """The limits (``LIMIT_WORDS``' keys) a result's message says the submission hit."""
    return [k for k, words in LIMIT_WORDS.items() if any(w in message for w in words)]


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=60)
    db.execute(
        f"CREATE TABLE IF NOT EXISTS {VERDICTS} (assignment TEXT NOT NULL, "
        "student TEXT NOT NULL, test TEXT NOT NULL, score REAL, max_score REAL, "
        "passed INTEGER, mistake TEXT, refused TEXT, message TEXT, "
        "PRIMARY KEY (assignment, student, test))"
    )
    db.execute(
        f"CREATE TABLE IF NOT EXISTS {ATTEMPTS} (assignment TEXT NOT NULL, "
        "student TEXT NOT NULL, outcome TEXT NOT NULL, limits TEXT, message TEXT, "
        "attempted_at TEXT, PRIMARY KEY (assignment, student))"
    )
    return db


def _attempt(db, assignment: str, student: str, outcome: str, message: str) -> None:
    db.execute(
        f"INSERT OR REPLACE INTO {ATTEMPTS} VALUES (?, ?, ?, ?, ?, ?)",
        (
            assignment,
            student,
            outcome,
            ",".join(limits_hit(message)),
            message,
            datetime.now(UTC).isoformat(timespec="seconds"),
        ),
    )


def record_graded(path: Path, assignment: str, student: str, result: dict) -> None:
    """The verdicts of a grade the gradebook now holds, replacing the student's rows."""
    with _connect(path) as db:
        db.execute(
            f"DELETE FROM {VERDICTS} WHERE assignment = ? AND student = ?",
            (assignment, student),
        )
        db.executemany(
            f"INSERT INTO {VERDICTS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    assignment,
                    student,
                    t["id"],
                    t["score"],
                    t["max_score"],
                    int(bool(t["passed"])),
                    t.get("mistake"),
                    t.get("refused"),
                    t["message"],
                )
                for t in result["tests"]
            ],
        )
        _attempt(db, assignment, student, GRADED, result.get("message") or "")


def record_attempt(
    path: Path, assignment: str, student: str, outcome: str, message: str
) -> None:
    """An attempt that recorded no grade (``NOT_GRADED``, ``NOT_AUTOGRADED``), and why."""
    with _connect(path) as db:
        _attempt(db, assignment, student, outcome, message)


def read(path: Path, assignment: str) -> tuple[dict[str, dict], list[dict]]:
    """``({student: attempt}, [verdict rows])`` of one assignment; empty when none."""
    if not Path(path).is_file():
        return {}, []
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        try:
            attempts = db.execute(
                f"SELECT * FROM {ATTEMPTS} WHERE assignment = ?", (assignment,)
            ).fetchall()
            verdicts = db.execute(
                f"SELECT * FROM {VERDICTS} WHERE assignment = ?", (assignment,)
            ).fetchall()
        except sqlite3.OperationalError:  # no table yet: graded before this record
            return {}, []
    return {a["student"]: dict(a) for a in attempts}, [dict(v) for v in verdicts]

"""Submission times for submissions placed by hand in ``submitted/<student>/<assignment>/``.

nbgrader's late penalty needs a submission's time. ``nbgrader collect`` writes it in the
submission's folder as ``timestamp.txt`` (one line, ``2026-01-16 10:00:00.000000 UTC``);
``nbgrader autograde`` reads it from there (``CourseDirectory.get_existing_timestamp``)
into the gradebook. A submission without one is recorded with no time, and a submission
with no time is never late, whatever the due date. ``autograde --timestamps FILE`` writes
each hand-placed submission's ``timestamp.txt`` from a CSV the instructor keeps (the
times the LMS or the mail showed), before anything is graded.
"""

from __future__ import annotations

import csv
import re
from datetime import UTC, datetime
from pathlib import Path

# nbgrader's exchange writes times in this form (``Exchange.timestamp_format``), in UTC here
FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"
COLUMNS = ("student_id", "timestamp")


class StampError(Exception):
    """Bad times: nothing was written; the message says what to fix."""


def _parse(text: str) -> datetime:
    """A time as the instructor writes one: a zone name after the date and time
    (``Europe/Berlin``, ``UTC``), an offset (``+02:00``, ``+0200``), or none, which
    means UTC as it does to nbgrader. Naive UTC, as nbgrader stores it. (nbgrader's own
    reader takes ``+0200`` after a space for 200 seconds: hence the file gets UTC.)"""
    from dateutil import parser, tz

    text = text.strip()
    head, _, zone = text.rpartition(" ")
    if head and re.fullmatch(r"[A-Za-z_]+(/[A-Za-z0-9_+-]+)*", zone):
        where = tz.gettz(zone)
        if where is None:
            raise ValueError(f"unknown time zone {zone!r}")
        when = parser.parse(head).replace(tzinfo=where)
    else:
        when = parser.parse(text)
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when


def _as_nbgrader_reads(path: Path) -> datetime:
    from nbgrader.utils import parse_utc

    return parse_utc(path.read_text().strip())


def read(path: Path) -> dict[str, datetime]:
    """Each student's submission time from a CSV with the columns ``student_id`` and
    ``timestamp``."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    if not rows or any(c not in rows[0] for c in COLUMNS):
        raise StampError(
            f"{path}: a CSV with the columns {', '.join(COLUMNS)} (one row per "
            "submission), e.g. alice,2026-01-16 10:00:00 Europe/Berlin"
        )
    times, bad = {}, []
    for line, row in enumerate(rows, start=2):
        try:
            times[row["student_id"].strip()] = _parse(row["timestamp"])
        except (ValueError, OverflowError, TypeError, AttributeError):
            bad.append(f"line {line}: {row['timestamp']!r}")
    if bad:
        raise StampError(
            f"{path}: not a time nbgrader reads ({'; '.join(bad)}); write e.g. "
            "2026-01-16 10:00:00 Europe/Berlin (no zone: UTC)"
        )
    return times


def stamp(root: Path, assignment: str, times: dict[str, datetime]) -> list[str]:
    """Write each submission's ``timestamp.txt``; return what was done, one line per
    student. Refuses everything (``StampError``) when a student has no submission
    folder or already has a different time (nbgrader's collect wrote it: delete it to
    replace it)."""
    problems, todo, lines = [], {}, []
    for student, when in sorted(times.items()):
        folder = root / "submitted" / student / assignment
        if not folder.is_dir():
            problems.append(f"{student}: no submission at {folder}")
            continue
        existing = folder / "timestamp.txt"
        if existing.is_file() and existing.read_text().strip():
            had = _as_nbgrader_reads(existing)
            if had != when:
                problems.append(
                    f"{student}: {existing} already says {had:%Y-%m-%d %H:%M:%S} UTC "
                    "(delete it to replace it)"
                )
            else:
                lines.append(
                    f"{student}: submitted {when:%Y-%m-%d %H:%M:%S} UTC (kept)"
                )
            continue
        todo[student] = existing
    if problems:
        raise StampError("no time written: " + "; ".join(problems))
    for student, path in todo.items():
        when = times[student]
        path.write_text(when.strftime(FORMAT) + "\n")
        done = root / "autograded" / student / assignment
        again = (
            f"; already autograded without it: grade again with --student {student} "
            "--force"
            if done.is_dir()
            else ""
        )
        lines.append(f"{student}: submitted {when:%Y-%m-%d %H:%M:%S} UTC{again}")
    return lines


def unstamped(root: Path, assignment: str, students: list[str]) -> tuple[list, str]:
    """``(students, due date)``: those of ``students`` whose submission carries no
    time, when the gradebook gives the assignment a due date (else nobody). Read-only:
    it runs while nothing else writes the gradebook, before a class run."""
    import sqlite3

    db = root / "gradebook.db"
    if not db.is_file():
        return [], ""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        try:
            row = con.execute(
                "SELECT duedate FROM assignment WHERE name = ?", (assignment,)
            ).fetchone()
        except sqlite3.Error:  # no assignment table yet
            return [], ""
    if row is None or row[0] is None:
        return [], ""
    return [
        s
        for s in students
        if not (root / "submitted" / s / assignment / "timestamp.txt").is_file()
    ], str(row[0])


# --- times a student cannot write ---------------------------------------------------


def arrived(folder: Path | str) -> datetime:
    """When a submission reached the exchange, by what its submitter cannot set: the
    latest change time (ctime) of its folder and of everything in it, naive UTC. A
    folder's name and its ``timestamp.txt`` are the submitting student's to write (a
    name stamped in the future, a time in the past); a change time is the kernel's, set
    to the present by every change (``utime`` sets the other two times, never this one),
    so a student can only make it later. Copying the exchange elsewhere sets it to the
    time of the copy: collect from the exchange itself."""
    import os

    latest = os.lstat(folder).st_ctime
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            latest = max(latest, os.lstat(os.path.join(top, name)).st_ctime)
    return datetime.fromtimestamp(latest, UTC).replace(tzinfo=None)


def write_time(folder: Path | str, when: datetime) -> None:
    """``folder/timestamp.txt`` as nbgrader's collect leaves it, with ``when`` (naive
    UTC): the time nbgrader's autograde records and judges lateness by."""
    (Path(folder) / "timestamp.txt").write_text(when.strftime(FORMAT))


def named_time(name: str) -> datetime | None:
    """The time an exchange folder's name gives (``student+assignment+time+random``),
    naive UTC; None if it gives none. For the log only: it never decides anything."""
    from nbgrader.utils import parse_utc

    parts = name.rsplit("+", 3)
    try:
        return parse_utc(parts[2]) if len(parts) >= 3 else None
    except (ValueError, TypeError, OverflowError):
        return None

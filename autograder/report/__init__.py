"""The instructor's class report (``python -m autograder report``): what the class got
wrong, read from the gradebook after an autograde. ``data`` reads the gradebook and the
recorded verdicts into plain rows, ``figures`` draws the plots, ``page`` writes the HTML
page and the CSV. It neither builds nor grades."""

from __future__ import annotations

from pathlib import Path


def report(db: Path, assignments: list[str], out: Path, stem: str, names: bool):
    """Write the report of ``assignments`` (one, or several for the class-wide form) to
    ``out/<stem>.html`` and ``.csv``; return their paths."""
    from autograder.report import data, page

    course = data.read_course(db, assignments)
    return page.write(course, out, stem, db, names)

"""The instructor's class report (``python -m autograder report``): what the class got
wrong, read from the gradebook after an autograde. ``data`` reads the gradebook and the
recorded verdicts into plain rows, ``figures`` draws the plots, ``page`` writes the HTML
page and the CSV. It neither builds nor grades."""

from __future__ import annotations

from pathlib import Path


def report(
    db: Path,
    assignments: list[str],
    out: Path,
    stem: str,
    names: bool,
    class_wide: bool = False,
):
    """Write the report of ``assignments`` to ``out/<stem>.html`` and ``.csv``
    (``<stem>-named`` with the students' ids; the class-wide form: with a heat map of
    students by exercises); return their paths."""
    from autograder.report import data, page

    course = data.read_course(db, assignments)
    return page.write(course, out, stem, db, names, class_wide)

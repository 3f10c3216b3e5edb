"""The code the grader reads (never runs) to judge a submission: the student's own code
cells, and the course's cells that the student notebook came with."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from dataclasses import dataclass, field

import nbformat

from autograder.paths import release_notebook


def is_test_cell(cell) -> bool:
    """An nbgrader test cell: ours to judge, never run (its code comes from the course)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


@functools.cache
def _given_cells(chapter: str) -> tuple[tuple[str, bool], ...]:
    """The released notebook's code cells other than the exercises (the course's own),
    as (source, tagged ``demo``): read once per process, not once per notebook."""
    try:
        release = _release(chapter)
    except OSError:
        return ()
    return tuple(
        (c.source, "demo" in c.get("metadata", {}).get("tags", []))
        for c in release.cells
        if c.cell_type == "code"
        and not c.get("metadata", {}).get("nbgrader", {}).get("solution", False)
    )


def is_course_cell(cell) -> bool:
    """A read-only cell of the course's (imports, helpers, visible checks, demos): not
    an exercise's, not a test cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("locked")) and not (meta.get("solution") or meta.get("grade"))


@functools.cache
def _release(chapter: str):
    return nbformat.read(release_notebook(chapter), as_version=4)


def course_cells(chapter: str) -> list:
    """The released notebook's cells that carry a grade id, in order (a copy)."""
    return [
        copy.deepcopy(c)
        for c in _release(chapter).cells
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    ]


def given_sources(chapter: str) -> list[str]:
    """The course's own code cells of ``chapter``'s student notebook."""
    return [source for source, _ in _given_cells(chapter)]


def demo_sources(chapter: str) -> frozenset[str]:
    """Given cells tagged ``demo`` (training runs, benchmarks, figures): not needed to
    grade, so skipped while unchanged. A chapter's demo cells define nothing the
    exercises need."""
    return frozenset(source for source, demo in _given_cells(chapter) if demo)


@dataclass(frozen=True)
class StudentCode:
    """What the code-reading rules read: the student's code (``cells``) and the course's
    given cells of the chapter (``given``), whose names are not the student's doing."""

    cells: list[str]
    given: list[str] = field(default_factory=list)
    # each (exercise, forbidden features)'s remark, when the code was read elsewhere
    # (``judging.reading``); None: ``judge.verdict`` reads it itself
    remarks: dict | None = None

    @classmethod
    def of_notebook(cls, nb, chapter: str) -> StudentCode:
        """The student's own code: every code cell that runs (test cells never do) but
        the course's, unchanged (grading restores them first: ``grade.restored``).
        A student's copy of a course cell, unchanged, is the course's code too."""
        given = given_sources(chapter)
        unchanged = set(given)
        cells = [
            c.source
            for c in nb.cells
            if c.get("cell_type") == "code"
            and not is_test_cell(c)
            and c.source not in unchanged
        ]
        return cls(cells, given)


def grading_key(nb) -> str:
    """A fingerprint of all that grading reads from a notebook: its cells' kinds, the
    sources of every cell but the test cells (which are never run), and which cells are
    test cells. Outputs, ids and other metadata do not count."""
    cells = [
        (
            c.get("cell_type"),
            "" if is_test_cell(c) else c.get("source", ""),
            is_test_cell(c),
            c.get("metadata", {}).get("nbgrader", {}).get("grade_id"),
        )
        for c in nb.cells
    ]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()

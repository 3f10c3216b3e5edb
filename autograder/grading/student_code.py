"""The code the grader reads (never runs) to judge a submission: the student's own code
cells, and the course's cells that the student notebook came with."""

from __future__ import annotations

import functools
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
        release = nbformat.read(release_notebook(chapter), as_version=4)
    except OSError:
        return ()
    return tuple(
        (c.source, "demo" in c.get("metadata", {}).get("tags", []))
        for c in release.cells
        if c.cell_type == "code"
        and not c.get("metadata", {}).get("nbgrader", {}).get("solution", False)
    )


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

    @classmethod
    def of_notebook(cls, nb, chapter: str) -> StudentCode:
        """Every code cell that runs (test cells never do) except the course's unchanged
        ones."""
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

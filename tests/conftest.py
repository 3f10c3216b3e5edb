"""Shared helpers: the derived notebooks, and student notebooks answered right or wrong."""

from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest

from autograder import paths
from autograder.build.solution_cells import BEGIN, END
from autograder.grading.spec import graded_chapters

CHAPTERS = graded_chapters()


def _is_solution(cell) -> bool:
    return cell.get("metadata", {}).get("nbgrader", {}).get("solution", False)


def release_notebook(chapter: str):
    return nbformat.read(paths.release_notebook(chapter), as_version=4)


def source_notebook(chapter: str):
    return nbformat.read(paths.nbgrader_source(chapter), as_version=4)


def answers(chapter: str) -> dict[str, str]:
    """The reference answer of every exercise cell, by grade id, without nbgrader's markers."""
    return {
        cell.metadata.nbgrader.grade_id: "\n".join(
            line
            for line in cell.source.splitlines()
            if line.strip() not in (BEGIN, END)
        )
        for cell in source_notebook(chapter).cells
        if _is_solution(cell)
    }


def student_notebook(chapter: str, edit: Callable[[str], str] | None = None):
    """The released notebook as a student who copied the reference would submit it;
    ``edit`` changes each answer (to make a plausible wrong one)."""
    nb = release_notebook(chapter)
    filled = answers(chapter)
    for cell in nb.cells:
        if _is_solution(cell):
            cell.source = filled[cell.metadata.nbgrader.grade_id]
            if edit is not None:
                cell.source = edit(cell.source)
    return nb


def write(nb, path: Path) -> Path:
    nbformat.write(nb, path)
    return path


@pytest.fixture(params=CHAPTERS)
def chapter(request) -> str:
    return request.param


_TIMINGS: dict[str, float] = {}


@pytest.fixture
def notebook_timings() -> dict[str, float]:
    return _TIMINGS


def pytest_terminal_summary(terminalreporter):
    """Report measured figures (a benchmark's print, not a timed assertion)."""
    if _TIMINGS:
        terminalreporter.section(
            "chapter notebooks: seconds to run top to bottom (budget 120 s)"
        )
        for chapter, seconds in sorted(_TIMINGS.items()):
            terminalreporter.write_line(f"{chapter}: {seconds:.1f} s")

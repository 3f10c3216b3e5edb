"""pytest's fixtures and the report of measured figures (helpers: ``tests/notebooks.py``)."""

import pytest

from autograder.grading.spec import graded_chapters

CHAPTERS = graded_chapters()


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

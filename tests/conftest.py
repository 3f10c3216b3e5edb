"""pytest's fixtures and the report of measured figures (helpers: ``tests/notebooks.py``)."""

import os
import subprocess
from pathlib import Path

import pytest

from autograder.build.book import book_command, book_env
from autograder.grading.judging.spec import graded_chapters

CHAPTERS = graded_chapters()


@pytest.fixture(params=CHAPTERS)
def chapter(request) -> str:
    return request.param


BOOK_THREADS = 4  # the book's demos run on four threads here, on one in test_notebooks


# The book, shared by tests/test_book.py and tests/test_edition.py (which builds the
# student edition's book from this build's executed outputs).
@pytest.fixture(scope="session")
def html(tmp_path_factory) -> Path:
    """The book, built once per session (it executes every chapter: minutes). A maintainer
    who works on the browser tests may point ``COURSE_BUILT_BOOK`` at a book already built
    (its ``_build/html``) to skip the build; CI never sets it."""
    if os.environ.get("COURSE_BUILT_BOOK"):
        return Path(os.environ["COURSE_BUILT_BOOK"])
    out = tmp_path_factory.mktemp("book")
    run = subprocess.run(
        book_command(path_output=out, rebuild_all=True),
        capture_output=True,
        text=True,
        timeout=1800,
        # as on a headless server (the book must still show every figure), and on four
        # threads: test_notebooks runs the same demos on one, and each claim the prose
        # makes about them (course_utils.claim) must hold on both
        env=book_env(MPLBACKEND="Agg", OMP_NUM_THREADS=str(BOOK_THREADS)),
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    return out / "_build" / "html"


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

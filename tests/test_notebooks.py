"""The filled-in student notebooks run top to bottom without an error (timed against the
budget), on one thread, with every claim their text makes about a demo borne out."""

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from nbclient import NotebookClient

from autograder.build.book import STRICT_CLAIMS
from tests.figures import alt_text_problems
from tests.notebooks import student_notebook

pytestmark = pytest.mark.slow
BUDGET_SECONDS = (
    120  # the course's budget: every chapter runs on a 2-core CPU in under 2 minutes
)
# Each notebook runs on one thread, so two run at once, each on a core of its own (the
# claims are about outputs, never about time); with one core, one at a time.
AT_ONCE = max(1, min(2, os.cpu_count() or 1))


def _run(chapter: str):
    """The chapter's filled-in notebook, executed; its seconds; nbclient's error, if any.
    One thread here and four in the book build (test_book): a demo whose claim holds on
    one machine only fails one of the two."""
    env = {**os.environ, **STRICT_CLAIMS, "OMP_NUM_THREADS": "1"}
    nb = student_notebook(chapter)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"notebook-{chapter}-") as folder:
        try:
            NotebookClient(
                nb,
                timeout=BUDGET_SECONDS,
                kernel_name="python3",
                resources={"metadata": {"path": folder}},
            ).execute(env=env)
        except Exception as exc:  # noqa: BLE001 (its test reports it)
            return nb, time.perf_counter() - start, exc
    return nb, time.perf_counter() - start, None


@pytest.fixture(scope="module")
def executed(request) -> dict:
    """Every chapter this session tests, run ``AT_ONCE`` at a time, once."""
    chapters = sorted(
        {
            item.callspec.params["chapter"]
            for item in request.session.items
            if item.module is request.module and hasattr(item, "callspec")
        }
    )
    with ThreadPoolExecutor(AT_ONCE) as pool:
        return dict(zip(chapters, pool.map(_run, chapters), strict=True))


def test_filled_in_notebook_runs_top_to_bottom(chapter, executed, notebook_timings):
    nb, seconds, failure = executed[chapter]
    notebook_timings[chapter] = seconds
    if failure is not None:
        raise failure
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors
    # every figure the notebook draws carries its text alternative (myst-nb's metadata,
    # which the book renders as the image's alt)
    figures = [
        (f"cell {i}", c.metadata.get("mystnb", {}).get("image", {}).get("alt"))
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        and any("image/png" in o.get("data", {}) for o in c.get("outputs", []))
    ]
    assert not alt_text_problems(figures)
    check_cells = [c for c in nb.cells if "checks" in c.metadata.get("tags", [])]
    printed = "".join(o.get("text", "") for c in check_cells for o in c.outputs)
    assert check_cells and printed.count("\N{CHECK MARK}") == len(check_cells)

"""The filled-in student notebooks run top to bottom without an error (timed against the
budget), on one thread, with every claim their text makes about a demo borne out."""

import time

import pytest
from nbclient import NotebookClient

from autograder.build.book import STRICT_CLAIMS
from tests.figures import alt_text_problems
from tests.notebooks import student_notebook

pytestmark = pytest.mark.slow
BUDGET_SECONDS = (
    120  # the course's budget: every chapter runs on a 2-core CPU in under 2 minutes
)


def test_filled_in_notebook_runs_top_to_bottom(
    chapter, tmp_path, notebook_timings, monkeypatch
):
    # One thread here and four in the book build (test_book): a demo whose claim holds on
    # one machine only fails one of the two (the kernel inherits this environment).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name, value in STRICT_CLAIMS.items():
        monkeypatch.setenv(name, value)
    nb = student_notebook(chapter)
    start = time.perf_counter()
    NotebookClient(
        nb,
        timeout=BUDGET_SECONDS,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    notebook_timings[chapter] = time.perf_counter() - start
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

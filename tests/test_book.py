"""The book builds with warnings as errors, executing every chapter, and shows what it should."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.paths import REPO, chapter_ids
from tests.conftest import CHAPTERS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book")
    jb = Path(sys.executable).with_name("jupyter-book")
    run = subprocess.run(
        [
            str(jb),
            "build",
            str(REPO),
            "--path-output",
            str(out),
            "--warningiserror",
            "--keep-going",
            "--all",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    return out / "_build" / "html"


def _text(page: str) -> str:
    return re.sub(r"<[^>]+>", "", page)


@pytest.mark.parametrize("chapter", chapter_ids())
def test_every_chapter_page_exists(html, chapter):
    assert (html / "chapters" / chapter / f"{chapter}.html").exists()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_complete_chapter_page_shows_figures_and_no_errors(html, chapter):
    page = (html / "chapters" / chapter / f"{chapter}.html").read_text()
    assert len(re.findall(r'<img [^>]*src="[^"]*_images/[^"]+\.png"', page)) >= 2
    assert "Traceback" not in page and "output traceback" not in page
    assert "BEGIN SOLUTION" not in page and "run_hidden_test" not in page
    assert "raise NotImplementedError" in _text(
        page
    )  # the page shows the stubs, not the answers
    assert "\N{CHECK MARK}" in page  # the visible checks ran (on the reference)


def test_citations_resolve_to_the_bibliography(html):
    refs = _text((html / "references.html").read_text())
    assert "Attention is all you need" in refs and "Vaswani" in refs
    page = (
        html / "chapters" / "03_self_attention" / "03_self_attention.html"
    ).read_text()
    assert 'href="../../references.html#id' in page

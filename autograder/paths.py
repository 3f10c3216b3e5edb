"""Where things live in the repository, and how chapters are named."""

import importlib.util
import os
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = REPO / "chapters"
COURSE_ROOT = REPO / "autograder" / "course"  # nbgrader's course directory
COURSE_UTILS = CHAPTERS / "course_utils.py"

_CHAPTER_ID = re.compile(r"^(\d\d)_([a-z0-9_]+)$")


def chapter_ids() -> list[str]:
    """Every chapter folder, in order: ``01_bottleneck`` ... ``09_beyond_sequences``."""
    return sorted(
        p.name for p in CHAPTERS.iterdir() if p.is_dir() and _CHAPTER_ID.match(p.name)
    )


def module_name(chapter: str) -> str:
    """``03_self_attention`` -> ``self_attention`` (the solutions and hidden-test module)."""
    match = _CHAPTER_ID.match(chapter)
    if not match:
        raise ValueError(f"not a chapter id: {chapter!r}")
    return match.group(2)


def chapter_source(chapter: str) -> Path:
    """The chapter's MyST Markdown notebook, the one source of its prose, stubs and checks."""
    return CHAPTERS / chapter / f"{chapter}.md"


def nbgrader_source(chapter: str, root: Path = COURSE_ROOT) -> Path:
    return root / "source" / chapter / f"{chapter}.ipynb"


def release_notebook(chapter: str, root: Path = COURSE_ROOT) -> Path:
    return root / "release" / chapter / f"{chapter}.ipynb"


@cache
def load_course_utils():
    """The chapters' helper module (``chapters/course_utils.py``), which is not a package."""
    spec = importlib.util.spec_from_file_location("course_utils", COURSE_UTILS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def env_with_repo_on_path() -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH: what an
    nbgrader subprocess needs to load the course's config (which imports the grader)
    from any course root."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *extra])}


VERSION_FILE = REPO / "VERSION"


def course_version() -> str:
    """The course's semantic version: the one place it is written is ``VERSION``."""
    return VERSION_FILE.read_text().strip()


@cache
def book_address() -> str:
    """The published book's address, ending in ``/``: GitHub Pages' project address of
    ``repository.url`` in ``_config.yml`` (the one place it is written; the book's own
    ``html_baseurl``, ``book/_ext/course_book.py``, follows the same rule)."""
    import yaml

    url = yaml.safe_load((REPO / "_config.yml").read_text())["repository"]["url"]
    org, repo = url.rstrip("/").removesuffix(".git").split("/")[-2:]
    return f"https://{org.lower()}.github.io/{repo}/"


def chapter_page(chapter: str, anchor: str = "") -> str:
    """The address of a chapter's page in the published book, at ``anchor`` if given."""
    return f"{book_address()}chapters/{chapter}/{chapter}.html" + (
        f"#{anchor}" if anchor else ""
    )

"""Where things live in the repository, and how chapters are named."""

import importlib.util
import os
import re
import sys
import sysconfig
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = REPO / "chapters"
COURSE_ROOT = REPO / "autograder" / "course"  # nbgrader's course directory
COURSE_UTILS = CHAPTERS / "course_utils.py"

_CHAPTER_ID = re.compile(r"^(\d\d)_([a-z0-9_]+)$")


def chapter_ids() -> list[str]:
    """Every chapter folder, in order: ``01_bottleneck`` ... ``10_language_model``."""
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


def path_with_tools() -> str:
    """This process's PATH with the running interpreter's scripts folder first.

    nbgrader runs its own tools by name (``alembic`` when it makes a gradebook), PyTorch's
    extension builder runs ``ninja``, and ``jupyter-book`` sits beside the interpreter
    too: an environment that was never activated (an IDE, cron, a service) has them beside
    ``sys.executable`` but not on PATH."""
    scripts = [str(Path(sys.executable).parent), sysconfig.get_path("scripts")]
    current = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    ahead = [p for p in dict.fromkeys(scripts) if p not in current[: len(scripts)]]
    return os.pathsep.join([*ahead, *current])


def put_tools_on_path() -> None:
    """``path_with_tools`` for this process: every subprocess it starts inherits it."""
    os.environ["PATH"] = path_with_tools()


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


_GITHUB_REPOSITORY = re.compile(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?")


def github_repository(url: str) -> tuple[str, str]:
    """``(org, repo)`` of a GitHub repository's address; ValueError for any other."""
    match = _GITHUB_REPOSITORY.fullmatch(url)
    if not match:
        raise ValueError(
            f"not a GitHub repository's address (https://github.com/<org>/<repo>): {url!r}"
        )
    return match.group(1), match.group(2)


def pages_address(url: str) -> str:
    """The address GitHub Pages publishes a repository's book at, ending in ``/``: the
    one rule for the course's book (``book/_ext/course_book.py``), the student edition's
    (``autograder/build/edition.py``) and the feedback's links."""
    org, repo = github_repository(url)
    return f"https://{org.lower()}.github.io/{repo}/"


def book_address() -> str:
    """The address of the book students read: the course's (``repository.url`` in
    ``_config.yml``), or the student edition's when ``edition.feedback_links_here`` is set
    (a course taught for credit, whose own book is not published)."""
    import yaml

    config = yaml.safe_load((REPO / "_config.yml").read_text())
    edition = config.get("edition") or {}
    where = edition if edition.get("feedback_links_here") else config["repository"]
    return pages_address(str(where["url"]))


def chapter_page(chapter: str, anchor: str = "") -> str:
    """The address of a chapter's page in the published book, at ``anchor`` if given."""
    return f"{book_address()}chapters/{chapter}/{chapter}.html" + (
        f"#{anchor}" if anchor else ""
    )

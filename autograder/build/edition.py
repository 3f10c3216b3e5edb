"""The student edition: what a course taught for credit publishes, in a folder of its own.

``python -m autograder edition OUT_DIR`` writes into ``OUT_DIR`` a course that students may
see: their notebooks, the requirements and Binder set-up, the licences, the built book (with
the sources of its pages) and a workflow that publishes that book to GitHub Pages. The
folder becomes a public repository of its own, at the address ``edition.url`` in
``_config.yml``; every link in it (launch links, repository button, the book's address, the
notebooks' headers) points there. Nothing that grades goes in: no ``solutions/``, no
instructor notebooks, no hidden tests or known mistakes, no grader. ``--with-solutions
CHAPTER ...`` adds those chapters' worked solutions (``solutions/<module>.py``), once the
instructor chooses to release them.

The book cannot be built from the edition: its chapter pages import the reference answers
(a ``book-only`` cell) so that the exercises' outputs render. So the private course builds
it, with the edition's addresses, reusing the executed outputs of its own book build
(myst-nb's execution cache): only Sphinx runs again.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jupytext
import nbformat
import yaml

from autograder import paths
from autograder.build.book import book_command, book_env
from autograder.paths import pages_address

CONFIG = paths.REPO / "_config.yml"
EXTENSIONS = paths.REPO / "book" / "_ext"
# Where the edition keeps each chapter's student notebook; the launch links follow it.
NOTEBOOK = "notebooks/{chapter}.ipynb"
BOOK = "book"  # the built book, which the edition's workflow deploys as it is
WORKFLOW = ".github/workflows/book.yml"
COURSE_WORKFLOW = paths.REPO / ".github" / "workflows" / "book.yml"
# The course's files the edition carries as they are: licences and how to cite the course,
# its change log (each notebook's header links to it), and what students install.
CARRIED = [
    "LICENSE",
    "LICENSES",
    "CITATION.cff",
    "CHANGELOG.md",
    "requirements.txt",
    "binder",
]
# Written into an edition, so that a later run may replace it and nothing else.
MARK = ".course-edition"
# The cell each chapter page begins with, which imports the reference answers.
BOOK_ONLY = "book-only"
TEXT_SUFFIXES = {".html", ".md", ".ipynb", ".txt", ".js", ".cff", ".yml", ".xml", ""}


class EditionError(ValueError):
    """Bad input to the edition command: the message says what to do."""


def _config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def addresses() -> dict[str, str]:
    """The course's and the edition's repository and book addresses, from ``_config.yml``
    (``repository`` and ``edition``, the one place each is written)."""
    config = _config()
    found = {}
    for key in ("repository", "edition"):
        url = str(config.get(key, {}).get("url", "")).rstrip("/")
        try:
            found[f"{key}_book"] = pages_address(url)
        except ValueError as exc:
            raise EditionError(f"{key}.url in _config.yml: {exc}") from None
        found[key] = url
        found[f"{key}_branch"] = config[key].get("branch", "main")
    return found


def edition_book_config(cache: Path) -> dict:
    """``_config.yml`` as the edition's book is built with: the edition's repository (the
    book's address and buttons follow from it), its notebooks' paths for the launch links,
    and the course's execution cache (absolute paths: the file is written elsewhere)."""
    config = _config()
    config["repository"] = {
        **config["repository"],
        "url": config["edition"]["url"],
        "branch": config["edition"].get("branch", "main"),
    }
    config["execute"] = {**config["execute"], "cache": str(cache)}
    sphinx = config["sphinx"]
    sphinx["local_extensions"] = {
        name: str(EXTENSIONS) for name in sphinx["local_extensions"]
    }
    sphinx["config"] = {**sphinx["config"], "course_notebook_path": NOTEBOOK}
    return config


def build_book(work: Path, cache: Path | None = None) -> Path:
    """Build the book with the edition's addresses under ``work``; return its HTML folder.

    ``cache`` is the course book's execution cache (default: where ``python -m autograder
    book`` keeps it): chapters already executed there are not run again."""
    cache = (cache or paths.REPO / "_build" / ".jupyter_cache").resolve()
    work.mkdir(parents=True, exist_ok=True)
    config = work / "_config.yml"
    config.write_text(yaml.safe_dump(edition_book_config(cache), sort_keys=False))
    command = book_command(path_output=work) + ["--config", str(config)]
    say(
        "building the edition's book: chapters already executed (by `python -m "
        "autograder book` or an earlier edition) are reused, the others run now"
    )
    build = subprocess.Popen(
        command,
        env=book_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    tail: list[str] = []
    for line in build.stdout:
        tail = [*tail[-200:], line]
        if PROGRESS.search(line):  # Sphinx's "[ 45%] page", myst-nb's executions
            say(line.strip())
    if build.wait() != 0:
        raise RuntimeError("the edition's book did not build:\n" + "".join(tail))
    return work / "_build" / "html"


# the lines of the book's build that show how far it has come
PROGRESS = re.compile(r"\[\s*\d+%\]|[Ee]xecut(ing|ed)")


def say(line: str) -> None:
    """A line of progress, on standard error (standard output says what was written)."""
    print(f"[edition] {line}", file=sys.stderr, flush=True)


def strip_book_only(path: Path) -> None:
    """Drop the ``book-only`` cells (the import of the reference answers) from a page's
    source in the built book: its MyST Markdown or its executed notebook (whose cells'
    ids, random at each build, are numbered instead: a new edition's diff shows changes
    only)."""
    if path.suffix == ".ipynb":
        notebook = nbformat.reads(path.read_text(), as_version=4)
    elif "```{code-cell}" in (text := path.read_text()):
        notebook = jupytext.reads(text, fmt="md:myst")
    else:
        return  # a page that is no notebook
    notebook.cells = [
        cell
        for cell in notebook.cells
        if BOOK_ONLY not in cell.get("metadata", {}).get("tags", [])
    ]
    if path.suffix == ".ipynb":
        for number, cell in enumerate(notebook.cells):
            cell.id = f"cell-{number}"
        path.write_text(nbformat.writes(notebook))
    else:
        path.write_text(jupytext.writes(notebook, fmt="md:myst"))


# The course's path of a student notebook, as pages name it ("<chapter>" may be HTML-escaped).
RELEASED_NOTEBOOK = re.compile(
    re.escape(f"{paths.COURSE_ROOT.relative_to(paths.REPO).as_posix()}/release/")
    + r"([\w<>&;-]+)/\1\.ipynb"
)
# Pages about the private course (its layout, its grading): their paths stay the course's.
INSTRUCTOR_PAGES = ("instructor_guide",)


def readdress(text: str, where: dict[str, str], paths_too: bool = True) -> str:
    """The course's addresses, wherever a page or notebook names them, become the
    edition's, and (``paths_too``) so do its student notebooks' paths: a student of the
    edition is sent to the edition."""
    for key in ("repository_book", "repository"):
        # not where the course's address begins a longer one (the edition's, say)
        old = re.escape(where[key].rstrip("/")) + r"(?![\w-])"
        text = re.sub(
            old, where[key.replace("repository", "edition")].rstrip("/"), text
        )
    if paths_too:
        text = RELEASED_NOTEBOOK.sub(NOTEBOOK.format(chapter=r"\1"), text)
    return text


def publishing_workflow() -> str:
    """The edition's workflow: deploy its built book (``book/``) to GitHub Pages on every
    push to its branch, executing nothing. Its steps are the course's book workflow's
    (the same pinned actions), less the build."""
    course = yaml.safe_load(COURSE_WORKFLOW.read_text())
    build, deploy = course["jobs"]["build"], course["jobs"]["deploy"]
    steps = {
        name: next(s for s in build["steps"] if name in s.get("uses", ""))
        for name in ("actions/checkout", "actions/upload-pages-artifact")
    }
    branch = addresses()["edition_branch"]
    upload = {**steps["actions/upload-pages-artifact"], "with": {"path": BOOK}}
    workflow = {
        "name": "Book",
        "on": {"push": {"branches": [branch]}, "workflow_dispatch": None},
        "permissions": {},
        "jobs": {
            "upload": {
                "runs-on": build["runs-on"],
                "timeout-minutes": 10,
                "permissions": {"contents": "read"},
                "steps": [steps["actions/checkout"], upload],
            },
            "deploy": {
                **deploy,
                "if": f"github.ref == 'refs/heads/{branch}'",
                "needs": "upload",
            },
        },
    }
    text = yaml.safe_dump(workflow, sort_keys=False, width=100)
    return (
        "# Written by `python -m autograder edition` in the course: publishes the built\n"
        "# book (book/) to GitHub Pages as it is; nothing is built or executed here.\n"
        + text.replace("'on':", "on:").replace(
            "workflow_dispatch: null", "workflow_dispatch:"
        )
    )


def readme(chapters: list[str], released: list[str]) -> str:
    where = addresses()
    version = paths.course_version()
    lines = [
        "# Attention: from the bottleneck to FlashAttention (student edition)",
        "",
        f"Course version {version}. The book: {where['edition_book']}",
        "",
        "## Your notebooks",
        "",
        "Each chapter's notebook is `notebooks/<chapter>.ipynb`; each chapter page of the book",
        "opens it in Colab or on Binder, or downloads it. To work on your own machine:",
        "",
        "```bash",
        "python -m pip install -r requirements.txt",
        "jupyter lab notebooks/",
        "```",
        "",
        "Run every cell in order, fill in each **Exercise**, and submit the notebook as your",
        "instructor tells you. Its hidden tests run when it is graded.",
        "",
        "| chapter | notebook |",
        "|---|---|",
        *(
            f"| {chapter} | [{NOTEBOOK.format(chapter=chapter)}]"
            f"({NOTEBOOK.format(chapter=chapter)}) |"
            for chapter in chapters
        ),
        "",
        "## What else is here",
        "",
        f"- `{BOOK}/`: the book, built; `{BOOK}/_sources/` holds the sources of its pages.",
        "- `binder/` and `requirements.txt`: what Binder and your machine install.",
        "- `LICENSE`, `LICENSES/`: text, figures and notebooks under CC BY 4.0, code under MIT.",
        "- `CITATION.cff`: how to cite the course; `CHANGELOG.md`: its changes.",
    ]
    if released:
        lines.append(
            "- `solutions/`: worked solutions, released for "
            + ", ".join(f"`{c}`" for c in released)
            + "."
        )
    return "\n".join(lines) + "\n"


def _clear(out: Path) -> None:
    """Empty ``out`` for a new edition, keeping its ``.git``; refuse a folder that holds
    something other than an edition, so that nothing of the instructor's is lost."""
    if not out.exists():
        out.mkdir(parents=True)
        return
    if not out.is_dir():
        raise EditionError(f"{out} is a file; give a new or empty folder")
    inside = [p for p in out.iterdir() if p.name != ".git"]
    if inside and not (out / MARK).exists():
        raise EditionError(
            f"{out} is not empty and holds no student edition ({MARK}); give a new or "
            "empty folder, or a clone of your edition's repository"
        )
    for path in inside:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def released_modules(with_solutions: list[str]) -> list[str]:
    """The solution modules of the chapters whose solutions are released."""
    from autograder.grading.judging.spec import graded_chapters

    unknown = sorted(set(with_solutions) - set(graded_chapters()))
    if unknown:
        raise EditionError(
            f"no graded chapter {', '.join(unknown)}; the chapters are "
            f"{', '.join(graded_chapters())}"
        )
    return [paths.module_name(chapter) for chapter in sorted(set(with_solutions))]


def write(out: Path, book_html: Path, with_solutions: list[str] = ()) -> Path:
    """Write the edition into ``out`` from a book already built by ``build_book``."""
    from autograder.grading.judging.spec import graded_chapters

    modules = released_modules(list(with_solutions))
    chapters = graded_chapters()
    where = addresses()
    _clear(out)
    (out / MARK).write_text(
        "Written by `python -m autograder edition`; a later run replaces everything here "
        "but .git.\n"
    )
    for name in CARRIED:
        source = paths.REPO / name
        if source.is_dir():
            shutil.copytree(source, out / name)
        else:
            shutil.copy2(source, out / name)
    for chapter in chapters:
        target = out / NOTEBOOK.format(chapter=chapter)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(paths.release_notebook(chapter), target)
    shutil.copytree(book_html, out / BOOK, ignore=shutil.ignore_patterns(".buildinfo"))
    for source in (out / BOOK / "_sources").rglob("*"):
        if source.suffix in (".md", ".ipynb"):
            strip_book_only(source)
    for module in modules:
        (out / "solutions").mkdir(exist_ok=True)
        shutil.copy2(paths.REPO / "solutions" / f"{module}.py", out / "solutions")
    (out / "README.md").write_text(readme(chapters, sorted(set(with_solutions))))
    (out / WORKFLOW).parent.mkdir(parents=True, exist_ok=True)
    (out / WORKFLOW).write_text(publishing_workflow())
    for path in out.rglob("*"):
        if path.is_file() and ".git" not in path.relative_to(out).parts[:1]:
            if path.suffix in TEXT_SUFFIXES and "LICENSES" not in path.parts:
                try:
                    text = path.read_text()
                except UnicodeDecodeError:
                    continue
                about_the_course = any(p in path.name for p in INSTRUCTOR_PAGES)
                if (new := readdress(text, where, not about_the_course)) != text:
                    path.write_text(new)
    return out


def make(out: Path, with_solutions: list[str] = (), cache: Path | None = None) -> Path:
    """Build the edition's book, then write the edition into ``out``."""
    released_modules(list(with_solutions))  # refuse a wrong chapter before the build
    with tempfile.TemporaryDirectory(prefix="edition-book-") as work:
        return write(out, build_book(Path(work), cache), with_solutions)

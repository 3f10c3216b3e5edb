"""The student edition (``python -m autograder edition``): what a course taught for credit
publishes holds no answer, its links lead into itself, and its book reads as the course's.

The edition's book is built from the session's course book (the ``html`` fixture), reusing
its executed outputs: only Sphinx runs again.
"""

import ast
import html as html_module
import json
import re
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import nbformat
import pytest

from autograder import paths
from autograder.__main__ import main
from autograder.build import edition
from autograder.grading.judging.spec import graded_chapters
from tests.browser import Browser, Site
from tests.test_publishing import LINTERS, _lint

WHERE = edition.addresses()
PRIVATE = ["solutions", "autograder/hidden_tests", "autograder/known_mistakes"]
# A line shorter than this, normalised, says too little to give an answer away:
# "return out", "x = x + 1", "super().__init__()".
MIN_LINE_CHARS = 20
RELEASED = (
    "03_self_attention"  # the chapter whose solutions the second edition releases
)


# What must not leak: the lines of the reference bodies -----------------------------------


def _normalised(line: str) -> str:
    return " ".join(line.split())


def _docstring_lines(node) -> set[int]:
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    ):
        return set(range(body[0].lineno, body[0].end_lineno + 1))
    return set()


def body_lines(path: Path) -> set[str]:
    """The lines of the bodies of every function and method in ``path``, normalised,
    without docstrings, comments and short lines."""
    source = path.read_text().splitlines()
    found = set()
    for node in ast.walk(ast.parse("\n".join(source))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        skip = _docstring_lines(node)
        for number in range(node.body[0].lineno, node.end_lineno + 1):
            line = _normalised(source[number - 1])
            if number not in skip and len(line) >= MIN_LINE_CHARS:
                if not line.startswith("#"):
                    found.add(line)
    return found


def given_lines() -> set[str]:
    """Every line of code the student notebooks give: the code a chapter gives to
    students is no leak."""
    found = set()
    for chapter in graded_chapters():
        notebook = nbformat.read(paths.release_notebook(chapter), as_version=4)
        for cell in notebook.cells:
            found |= {_normalised(line) for line in cell.source.splitlines()}
    return found


def private_lines(released: list[str] = ()) -> dict[str, str]:
    """``{line: the file it comes from}`` for the reference bodies, the hidden tests and
    the known mistakes, less the lines of the ``released`` chapters' solutions (which a
    later chapter's reference may reuse: it builds on an earlier chapter's answer)."""
    solutions = paths.REPO / "solutions"
    public = given_lines().union(
        *(body_lines(solutions / f"{paths.module_name(c)}.py") for c in released)
    )
    found = {}
    for folder in PRIVATE:
        for path in sorted((paths.REPO / folder).glob("*.py")):
            for line in body_lines(path) - public:
                found.setdefault(line, str(path.relative_to(paths.REPO)))
    return found


def readable_text(path: Path) -> str:
    """What a reader of the file sees: a page's text, a notebook's cells and outputs."""
    text = path.read_text()
    if path.suffix == ".html":
        return html_module.unescape(re.sub(r"<[^>]+>", "", text))
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        return "\n".join(
            "".join(cell["source"])
            + "\n"
            + "\n".join(
                "".join(o.get("text", "")) + json.dumps(o.get("data", {}))
                for o in cell.get("outputs", [])
            )
            for cell in cells
        )
    return text


def leaks(folder: Path, released: list[str] = ()) -> list[str]:
    """Each line of a reference body, hidden test or known mistake that a file of
    ``folder`` holds."""
    private = private_lines(released)
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            text = readable_text(path)
        except UnicodeDecodeError:
            continue  # images, fonts
        for line in {_normalised(line) for line in text.splitlines()} & private.keys():
            found.append(f"{path.relative_to(folder)}: {line!r} ({private[line]})")
    return found


# The editions, built once ----------------------------------------------------------------


@pytest.fixture(scope="session")
def edition_book(html, tmp_path_factory) -> Path:
    """The edition's book, from the course book's execution cache (beside its html/)."""
    return edition.build_book(
        tmp_path_factory.mktemp("edition-book"), html.parent / ".jupyter_cache"
    )


@pytest.fixture(scope="module")
def student_edition(edition_book, tmp_path_factory) -> Path:
    return edition.write(tmp_path_factory.mktemp("edition") / "out", edition_book)


@pytest.fixture(scope="module")
def edition_with_solutions(edition_book, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("edition-with-solutions") / "out"
    return edition.write(out, edition_book, [RELEASED])


@pytest.mark.slow
def test_the_edition_holds_what_students_need_and_nothing_that_grades(student_edition):
    top = {p.name for p in student_edition.iterdir()}
    assert top == {
        ".course-edition",
        ".github",
        "README.md",
        "LICENSE",
        "LICENSES",
        "CITATION.cff",
        "CHANGELOG.md",
        "requirements.txt",
        "binder",
        "notebooks",
        "book",
    }
    for chapter in graded_chapters():
        # the notebook students submit is the one the private course grades: the same
        # cells, but for its header, which names the edition
        ours = nbformat.read(paths.release_notebook(chapter), as_version=4)
        theirs = nbformat.read(
            student_edition / edition.NOTEBOOK.format(chapter=chapter), as_version=4
        )
        assert theirs.cells[0].id == ours.cells[0].id == "course-header"
        assert theirs.cells[1:] == ours.cells[1:] and theirs.metadata == ours.metadata
    assert not list(student_edition.rglob("*.py")), "code of the course in the edition"
    assert (student_edition / "book" / "index.html").exists()


@pytest.mark.slow
def test_no_line_of_an_answer_is_in_the_edition(student_edition):
    assert not leaks(student_edition), "\n".join(leaks(student_edition)[:20])


@pytest.mark.slow
def test_the_leak_check_sees_a_planted_answer_line(student_edition, tmp_path):
    """The test of the test: one line of a reference body, pasted into a page of the
    edition's book, is a leak."""
    line = max(
        body_lines(paths.REPO / "solutions" / "self_attention.py") - given_lines()
    )
    page = student_edition / "book" / "intro.html"
    original = page.read_text()
    try:
        page.write_text(
            original + f"<pre><span>{html_module.escape(line)}</span></pre>"
        )
        assert any("intro.html" in leak for leak in leaks(student_edition))
    finally:
        page.write_text(original)
    assert private_lines(), "no reference line to look for"


@pytest.mark.slow
def test_chapter_sources_in_the_edition_do_not_import_the_answers(
    html, student_edition
):
    sources = student_edition / "book" / "_sources"
    pages = list(sources.rglob("*.md"))
    assert len(pages) >= len(graded_chapters())
    for page in pages:
        text = page.read_text()
        assert edition.BOOK_ONLY not in text and "from solutions" not in text, page
    # the course's own sources have the cell that the edition's must not
    course = html / "_sources" / "chapters" / RELEASED / f"{RELEASED}.ipynb"
    assert "from solutions" in course.read_text()


@pytest.mark.slow
def test_released_solutions_are_exactly_the_named_chapters(edition_with_solutions):
    released = sorted((edition_with_solutions / "solutions").iterdir())
    module = paths.module_name(RELEASED)
    assert [p.name for p in released] == [f"{module}.py"]
    assert not leaks(edition_with_solutions, released=[RELEASED])
    # the check still sees them when the chapter is not named as released
    found = leaks(edition_with_solutions)
    assert found and all(f"solutions/{module}.py" in leak for leak in found)
    assert f"`{RELEASED}`" in (edition_with_solutions / "README.md").read_text()


def _launch_targets(page: str) -> list[tuple[str, str, str]]:
    """``(service, repository, path in the repository)`` of every launch link on a page."""
    found = []
    for link in map(html_module.unescape, re.findall(r'href="([^"]+)"', page)):
        url = urlparse(link)
        if url.netloc == "colab.research.google.com":
            match = re.fullmatch(r"/github/([^/]+/[^/]+)/blob/[^/]+/(.+)", url.path)
            found.append(("colab", match.group(1), match.group(2)))
        elif url.netloc == "mybinder.org":
            repo = re.fullmatch(r"/v2/gh/([^/]+/[^/]+)/[^/]+", url.path).group(1)
            path = re.search(r"urlpath=lab/tree/([^&]+)", unquote(url.query)).group(1)
            found.append(("binder", repo, path))
        elif (
            url.netloc
            == urlparse(edition._config()["launch_buttons"]["jupyterhub_url"]).netloc
        ):
            query = unquote(url.query)
            repo = re.search(r"repo=https://github.com/([^&]+)", query).group(1)
            tree = re.search(r"urlpath=lab/tree/([^&]+)", query).group(1)
            found.append(("jupyterhub", repo, tree.split("/", 1)[1]))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("chapter", graded_chapters())
def test_launch_links_open_a_notebook_of_the_edition(html, student_edition, chapter):
    book = student_edition / "book"
    page_path = book / "chapters" / chapter / f"{chapter}.html"
    page = page_path.read_text()
    edition_repo = urlparse(WHERE["edition"]).path.strip("/")
    targets = _launch_targets(page)
    assert {service for service, _, _ in targets} == {"colab", "binder", "jupyterhub"}
    for service, repo, path in targets:
        assert repo == edition_repo, f"{service} opens {repo}"
        assert path == edition.NOTEBOOK.format(chapter=chapter)
        assert (student_edition / path).is_file(), (
            f"{service}: no {path} in the edition"
        )
    # the download holds the edition's notebook; the buttons lead to the edition
    download = re.search(r'href="([^"]+)"[^>]*download>', page).group(1)
    copy = (page_path.parent / unquote(download)).resolve()
    assert copy.read_bytes() == (student_edition / path).read_bytes()
    assert f'href="{WHERE["edition"]}"' in page  # the repository button
    assert f'href="{WHERE["edition"]}/issues' in page
    canonical = re.search(r'<link rel="canonical" href="([^"]+)"', page).group(1)
    assert canonical == urljoin(
        WHERE["edition_book"], f"chapters/{chapter}/{chapter}.html"
    )
    # the test of the test: the course's own page, whose links lead into the course, fails it
    course_page = (html / "chapters" / chapter / f"{chapter}.html").read_text()
    assert {repo for _, repo, _ in _launch_targets(course_page)} == {
        urlparse(WHERE["repository"]).path.strip("/")
    }


@pytest.mark.slow
def test_no_page_or_notebook_sends_a_student_to_the_course_repository(
    html, student_edition
):
    course = re.compile(re.escape(WHERE["repository"]) + r"(?![\w-])")
    assert course.search((html / "book" / "setup.html").read_text())  # it would be seen
    for path in student_edition.rglob("*"):
        if path.is_file() and path.suffix in {".html", ".ipynb", ".md", ".cff"}:
            assert not course.search(path.read_text()), path
    header = nbformat.read(student_edition / "notebooks" / f"{RELEASED}.ipynb", 4)
    assert WHERE["edition"] in header.cells[0].source
    # the set-up page names the edition's notebooks; the instructor guide, the course's
    book = student_edition / "book" / "book"
    assert "autograder/course/release" in (html / "book" / "setup.html").read_text()
    setup = (book / "setup.html").read_text()
    assert "autograder/course/release" not in setup
    assert edition.NOTEBOOK.format(chapter=RELEASED) in setup
    assert "autograder/course/release" in (book / "instructor_guide.html").read_text()


REPOSITORIES = re.compile(r"github\.com/([\w.-]+/[\w-]+)|([\w-]+\.github\.io/[\w-]+)")


@pytest.mark.slow
def test_every_repository_and_book_the_edition_names_is_the_editions(
    html, student_edition
):
    """A page that names another course repository (say, the open course's address written
    out in a fork's pages) sends students to its answers."""
    ours = {
        urlparse(WHERE["edition"]).path.strip("/"),
        WHERE["edition_book"].split("//")[1].rstrip("/"),
    }
    named = {}
    for path in student_edition.rglob("*"):
        vendored = "_static" in path.parts and path.suffix != ".ipynb"  # MathJax...
        if path.suffix in {".html", ".ipynb", ".md", ".cff", ".js"} and not vendored:
            for match in REPOSITORIES.finditer(path.read_text()):
                named.setdefault(match.group(1) or match.group(2), path)
    others = {name: str(path) for name, path in named.items() if name not in ours}
    assert not others, (
        f"the edition names other repositories: {others}; write the course's address "
        "in its pages as repository.url in _config.yml has it (the edition rewrites that)"
    )
    assert ours <= named.keys()
    # the test of the test: the course's own set-up page names a repository not ours
    course = {
        m.group(1)
        for m in REPOSITORIES.finditer((html / "book" / "setup.html").read_text())
    }
    assert course and not course & ours


# The workflow that publishes the edition's book -------------------------------------------


@pytest.mark.parametrize("tool", LINTERS)
def test_the_editions_workflow_passes_the_linters(tool, tmp_path):
    workflow = tmp_path / edition.WORKFLOW
    workflow.parent.mkdir(parents=True)
    workflow.write_text(edition.publishing_workflow())
    run = _lint(tool, [workflow])
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_editions_workflow_deploys_its_built_book_and_runs_nothing():
    import yaml

    workflow = yaml.safe_load(edition.publishing_workflow())
    assert workflow[True]["push"]["branches"] == [WHERE["edition_branch"]]
    assert workflow["permissions"] == {}
    steps = workflow["jobs"]["upload"]["steps"]
    assert not [s for s in steps if "run" in s]
    assert steps[-1]["with"] == {"path": edition.BOOK}
    assert workflow["jobs"]["deploy"]["permissions"] == {
        "pages": "write",
        "id-token": "write",
    }


@pytest.mark.slow
def test_the_edition_carries_its_workflow(student_edition):
    assert (
        student_edition / edition.WORKFLOW
    ).read_text() == edition.publishing_workflow()


# Bad input loses nothing --------------------------------------------------------------


def test_an_unknown_chapter_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "edition"
    assert main(["edition", str(out), "--with-solutions", "03_self_atention"]) == 2
    assert "no graded chapter 03_self_atention" in capsys.readouterr().err
    assert not out.exists()


def test_an_edition_without_its_address_is_refused(monkeypatch, tmp_path):
    config = tmp_path / "_config.yml"
    config.write_text("repository:\n  url: https://github.com/a/b\n")
    monkeypatch.setattr(edition, "CONFIG", config)
    with pytest.raises(edition.EditionError, match="edition.url in _config.yml"):
        edition.addresses()


def test_a_folder_that_holds_no_edition_is_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(edition.EditionError, match="not empty"):
        edition.write(tmp_path, tmp_path / "no-book")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_new_edition_replaces_the_last_one_but_keeps_its_git(tmp_path):
    """The folder is a clone of the edition's repository: the command rewrites it."""
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / edition.MARK).write_text("")
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "bottleneck.py").write_text("# released last week\n")
    edition._clear(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [".git"]
    assert (tmp_path / ".git" / "HEAD").exists()


# In the browser: the edition's book reads as the course's own ------------------------------

PAGES = ["intro.html"] + [
    f"chapters/{c}/{c}.html"
    for c in ("01_bottleneck", "06_transformer", "09_beyond_sequences")
]
READ = """
for (const img of document.images) img.loading = "eager";
if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
  await MathJax.startup.promise;
}
await Promise.all([...document.images].map((img) => img.complete ? null :
  new Promise((done) => { img.onload = done; img.onerror = done; })));
return {
  headings: [...document.querySelectorAll("main h1, main h2, main h3")].map(
    (h) => h.textContent.trim()),
  figures: [...document.querySelectorAll("main img")].filter(
    (img) => img.complete && img.naturalWidth > 0).length,
  formulas: document.querySelectorAll("main mjx-container").length,
  untypeset: [...document.querySelectorAll("main .math")].filter(
    (m) => !m.querySelector("mjx-container")).length,
  bar: document.querySelectorAll(".course-launch-bar a").length,
  errors: document.querySelectorAll("main .output.traceback, main .output.error").length,
};
"""


def _prefix(url: str) -> str:
    return "/" + urlparse(url).path.strip("/").split("/")[-1] + "/"


@pytest.fixture(scope="module")
def sites(html, student_edition):
    course = Site(html, _prefix(WHERE["repository"]))
    published = Site(student_edition / "book", _prefix(WHERE["edition"]))
    chromium = Browser()
    yield course, published, chromium
    chromium.close()
    course.close()
    published.close()


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_editions_book_renders_as_the_courses(sites, page):
    course, published, chromium = sites
    ours, theirs = (
        chromium.visit(site.url + page, READ) for site in (course, published)
    )
    assert theirs.status == 200 and not theirs.errors and not theirs.failed, (
        theirs.errors,
        theirs.failed,
    )
    assert not [
        u for u in theirs.requested if not u.startswith((published.url, "data:"))
    ]
    assert theirs.value == ours.value
    assert theirs.value["untypeset"] == 0 and theirs.value["errors"] == 0
    if page.startswith("chapters/"):
        assert theirs.value["bar"] == 3 and theirs.value["figures"] >= 2
        assert theirs.value["formulas"] > 0


@pytest.mark.slow
def test_an_editions_chapter_page_meets_wcag_21_aa(sites):
    _, published, chromium = sites
    assert not chromium.accessibility_violations(published.url + PAGES[1])


def test_the_editions_build_shows_its_progress_page_by_page():
    """The edition's book build streams Sphinx's and myst-nb's progress lines, and only
    those (an instructor sees how far it has come, not Sphinx's every line)."""
    shown = [
        "reading sources... [ 45%] chapters/04_multi_head/04_multi_head",
        "writing output... [100%] intro",
        "Executing: chapters/03_self_attention/03_self_attention.md",
        "Executed chapters/03_self_attention/03_self_attention.md in 12.3s",
    ]
    hidden = [
        "WARNING: duplicate label",
        "building [html]: targets for 20 source files",
    ]
    assert all(edition.PROGRESS.search(line) for line in shown)
    assert not any(edition.PROGRESS.search(line) for line in hidden)

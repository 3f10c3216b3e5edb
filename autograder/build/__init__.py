"""Derive every notebook from the three sources: chapters, solutions and hidden tests.

For each chapter that has hidden tests:

1. ``chapters/<ch>/<ch>.md`` (MyST, read with jupytext) becomes the nbgrader *source*
   notebook ``autograder/course/source/<ch>/<ch>.ipynb``: book-only cells dropped, MyST
   turned into Markdown that Jupyter renders, the course helpers inlined, reference bodies
   fenced into the exercise stubs, and after each exercise's visible checks one graded
   cell per hidden test.
2. ``nbgrader generate_assignment`` makes the *student* notebook
   ``autograder/course/release/<ch>/<ch>.ipynb`` from it.

Every code cell of the course's own (the imports, helpers, visible checks, demos and
figures: all but the exercise cells) is an nbgrader read-only cell, with a grade id:
Jupyter will not let the student edit it, and grading runs the course's code in its place
whatever the submission holds there. The student notebook's first cell names the course
version (``header_cell``, from ``VERSION``); its first code cell sets it up on Colab
(``colab_setup_cell``) and does nothing elsewhere. ``stale_files()`` builds into a temporary course and lists the committed
files that differ from a fresh build.
"""

from __future__ import annotations

import ast
import base64
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jupytext
import nbformat

from autograder import paths
from autograder.build import stub_copies
from autograder.build.solution_cells import (
    exercise_names,
    fill_solutions,
    reference_definitions,
)
from autograder.build.student_markdown import to_jupyter_markdown
from autograder.grading.judging.spec import (
    ChapterTests,
    HiddenTest,
    graded_chapters,
    load_chapter_tests,
)

# Tags that only the book's build reads: stripped from the cells the notebooks keep.
BOOK_RENDERING_TAGS = {
    "book-only",
    "remove-cell",
    "skip-execution",
    "remove-input",
    "remove-output",
    "hide-input",
}


class BuildError(RuntimeError):
    pass


def _nbgrader(
    grade_id: str, *, solution=False, grade=False, locked=False, points=None
) -> dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if grade:
        meta["points"] = points
    return {"nbgrader": meta}


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _inline_course_utils(source: str) -> str:
    """Replace ``from course_utils import ...`` by the module itself, so notebooks stand alone."""
    text = paths.COURSE_UTILS.read_text()
    docstring = ast.parse(text).body[
        0
    ]  # the module docstring speaks to maintainers: leave it out
    module = "\n".join(text.splitlines()[docstring.end_lineno :]).strip("\n")
    header = (
        "# @title Course helpers: run this cell (no need to read it)\n"  # Colab folds it
        "# Shared by every chapter: a copy of chapters/course_utils.py."
    )
    lines = source.splitlines()
    for node in reversed(ast.parse(source).body):
        if isinstance(node, ast.ImportFrom) and node.module == "course_utils":
            lines[node.lineno - 1 : node.end_lineno] = [header, module, ""]
    return "\n".join(lines)


def _shipped_text(chapter: str, name: str) -> str:
    """The body of a cell that holds a text file shipped beside the chapter (its metadata
    says ``text_from: NAME``), so that the student notebook stands alone (Colab included)
    and nothing is downloaded: the book's cell reads the file, the notebook's decodes it.
    Compressed with a fixed timestamp, so that every build writes the same bytes."""
    raw = (paths.CHAPTERS / chapter / name).read_bytes()
    packed = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode()
    return "\n".join(
        [
            f"# {name}, shipped inside this notebook (gzip, then base64): nothing is",
            "# downloaded. The book reads the same file beside the chapter.",
            "import base64",
            "import gzip",
            "",
            f'SHIPPED = "{packed}"',
            "data_bytes = gzip.decompress(base64.b64decode(SHIPPED))",
        ]
    )


# Pinned distributions whose import name is not their name on PyPI.
IMPORT_NAMES = {"scikit_learn": "sklearn"}


def _pins() -> dict[str, str]:
    """``{module: "name==version"}`` for every package pinned in requirements.txt, keyed by
    the name a notebook imports (``sklearn`` for scikit-learn)."""
    pins = {}
    for line in (paths.REPO / "requirements.txt").read_text().splitlines():
        # the environment marker goes (triton's "; platform_system == ..."): Colab is Linux
        pin = line.split("#")[0].split(";")[0].strip()
        if "==" in pin:
            name = pin.split("==")[0].strip().lower().replace("-", "_")
            pins[IMPORT_NAMES.get(name, name)] = pin
    return pins


COLAB_SETUP = """\
# @title Set-up on Colab: run this cell first (elsewhere it does nothing)
# Colab comes with PyTorch, matplotlib and tqdm; this installs only what is missing, at
# the versions the course pins (requirements.txt in the course repository).
import importlib.util
import subprocess
import sys

if "google.colab" in sys.modules:
    pins = {PINS}
    missing = [
        pin for module, pin in pins.items() if not importlib.util.find_spec(module)
    ]
    if missing:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", *missing], check=True
        )"""


def colab_setup_cell(cells):
    """The first code cell of a student notebook: on Colab, install what the notebook imports
    and Colab lacks, at the versions pinned in requirements.txt; elsewhere, nothing."""
    code = "\n".join(c.source for c in cells if c.cell_type == "code")
    imported = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", code, re.M))
    pins = "".join(
        f'\n        "{module}": "{pin}",'
        for module, pin in sorted(_pins().items())
        if module in imported
    )
    cell = nbformat.v4.new_code_cell(
        COLAB_SETUP.replace("{PINS}", "{" + pins + ("\n    }" if pins else "}"))
    )
    cell.metadata.update(_nbgrader("colab_setup", locked=True))
    cell.metadata["cellView"] = "form"  # folded in Colab, under its title
    return cell


def lock_course_cell(cell, index: int) -> None:
    """Make one of the course's own code cells (imports, demos, figures) read-only: the
    student cannot edit it in Jupyter, and grading runs the course's code whatever the
    submission holds (nbgrader autograde's ``OverwriteCells``, ``grade.restored``). Its
    grade id keeps the cell id it had (``cell-007``)."""
    cell.metadata.update(_nbgrader(f"cell_{index:03d}", locked=True))


def _repository() -> dict:
    """``repository:`` in ``_config.yml``: the one place the course's address is written."""
    import yaml

    return yaml.safe_load((paths.REPO / "_config.yml").read_text())["repository"]


def repository_url() -> str:
    return _repository()["url"].rstrip("/")


def header_cell():
    """The notebook's first cell: which course, which version (``VERSION``), where it
    comes from, under which licences."""
    cell = nbformat.v4.new_markdown_cell(
        f"*Attention: from the bottleneck to FlashAttention*, course version "
        f"**{paths.course_version()}** ([changes]({repository_url()}/blob/{_repository()['branch']}/CHANGELOG.md)). "
        f"Text and notebooks [CC BY 4.0](https://creativecommons.org/licenses/by/4.0/), "
        f"code [MIT](https://opensource.org/license/mit); from {repository_url()}."
    )
    cell.id = "course-header"
    return cell


def hidden_test_cell(chapter: str, test: HiddenTest):
    source = "\n".join(
        [
            f"# Hidden test `{test.id}` ({test.points:g} point{'s' if test.points != 1 else ''}): {test.description}.",
            "# It runs when your notebook is graded, on inputs drawn at grading time.",
            "### BEGIN HIDDEN TESTS",
            "from autograder.grading.nbgrader_bridge import run_hidden_test",
            "",
            f'run_hidden_test("{chapter}", "{test.id}", globals())',
            "### END HIDDEN TESTS",
        ]
    )
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata = _nbgrader(test.id, grade=True, locked=True, points=test.points)
    return cell


def source_notebook(chapter: str, tests: ChapterTests):
    """The nbgrader source notebook of one chapter (solutions and hidden tests included)."""
    md = jupytext.read(paths.chapter_source(chapter))
    reference = reference_definitions(
        paths.REPO / "solutions" / f"{paths.module_name(chapter)}.py"
    )
    cells, pending, defined = [], [], []
    for cell in md.cells:
        tags = _tags(cell)
        if "book-only" in tags:
            continue
        kept_tags = [t for t in tags if t not in BOOK_RENDERING_TAGS]
        if cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(to_jupyter_markdown(cell.source))
        else:
            new = nbformat.v4.new_code_cell(cell.source)
            if "mystnb" in cell.metadata:  # a figure's text alternative travels with it
                new.metadata["mystnb"] = cell.metadata["mystnb"]
        if kept_tags:
            new.metadata["tags"] = kept_tags
        if cell.cell_type == "code" and "text_from" in cell.metadata:
            new.source = _shipped_text(chapter, cell.metadata["text_from"])
        if "course-utils" in tags:
            new.source = _inline_course_utils(cell.source)
            new.metadata.update(_nbgrader("course_utils", locked=True))
            new.metadata["jupyter"] = {"source_hidden": True}  # folded in JupyterLab
            new.metadata["cellView"] = "form"  # folded in Colab
        elif "exercise" in tags:
            names = exercise_names(cell.source)
            new.source = fill_solutions(
                cell.source, reference, f"{chapter}, exercise cell {names}"
            )
            new.metadata.update(_nbgrader(f"exercise_{names[0]}", solution=True))
            pending = [t for t in tests.tests if t.exercise in names]
            defined += names
        elif "checks" in tags:
            new.metadata.update(
                _nbgrader(
                    f"checks_{defined[-1] if defined else len(cells)}", locked=True
                )
            )
        cells.append(new)
        if "checks" in tags:
            cells += [hidden_test_cell(chapter, t) for t in pending]
            pending = []
    placed = {c.metadata.get("nbgrader", {}).get("grade_id") for c in cells}
    unplaced = [t.id for t in tests.tests if t.id not in placed]
    if unplaced:
        raise BuildError(
            f"{chapter}: hidden tests {unplaced} have no exercise cell followed by a checks cell"
        )
    undefined = set(tests.exercises) - set(defined)
    if undefined:
        raise BuildError(
            f"{chapter}: hidden tests name exercises no exercise cell defines: {sorted(undefined)}"
        )
    first_code = next(i for i, c in enumerate(cells) if c.cell_type == "code")
    cells.insert(first_code, colab_setup_cell(cells))
    for i, cell in enumerate(cells):
        if cell.cell_type == "code" and "nbgrader" not in cell.metadata:
            lock_course_cell(cell, i)
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell.id = grade_id.replace("_", "-") if grade_id else f"cell-{i:03d}"
    cells.insert(0, header_cell())  # after the ids above: theirs do not move
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
            "name": "python3",
        },
        "language_info": {"name": "python"},
    }
    nbformat.validate(nb)
    return nb


def _write(nb, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def generate_release(chapter: str, root: Path) -> None:
    """nbgrader's own generate_assignment, run in the course root ``root``."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nbgrader",
            "generate_assignment",
            chapter,
            "--force",
            "--log-level=WARN",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env=paths.env_with_repo_on_path(),
    )
    if result.returncode != 0 or not paths.release_notebook(chapter, root).exists():
        raise BuildError(
            f"nbgrader generate_assignment {chapter} failed:\n{result.stdout}\n{result.stderr}"
        )


def build(
    root: Path = paths.COURSE_ROOT,
    chapters: list[str] | None = None,
    refresh_sources: bool = True,
) -> list[Path]:
    """Write source and release notebooks under the course root ``root``; returns them
    (and the chapters whose derived stub cells it rewrote, ``stub_copies``, unless
    ``refresh_sources`` is False).

    Each chapter is generated in a scratch course root first (nbgrader's --force empties
    the release folder before it writes), and its notebooks replace the ones in ``root``
    only once both exist: a build that fails leaves every derived file of the failing
    chapter as it was. nbgrader runs for several chapters at once (one process each,
    a process per core), since each spends seconds on one core."""
    written = []
    chapters = chapters or graded_chapters()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = {}
        for chapter in chapters:
            if refresh_sources and stub_copies.refresh(chapter):
                written.append(paths.chapter_source(chapter))
            scratch[chapter] = Path(tmp) / chapter
            scratch[chapter].mkdir()
            shutil.copy(paths.COURSE_ROOT / "nbgrader_config.py", scratch[chapter])
            source = source_notebook(chapter, load_chapter_tests(chapter))
            _write(source, paths.nbgrader_source(chapter, scratch[chapter]))
        workers = max(1, min(len(chapters), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            failures = pool.map(_generate_or_error, chapters, scratch.values())
            failures = [f for f in failures if f is not None]
        failed = {f.chapter for f in failures}
        for chapter in chapters:
            if chapter in failed:
                continue
            for where in (paths.nbgrader_source, paths.release_notebook):
                target = where(chapter, root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(
                    where(chapter, scratch[chapter]), target.with_suffix(".part")
                )
                os.replace(target.with_suffix(".part"), target)
                written.append(target)
    if failures:
        raise failures[0]
    return written


def _generate_or_error(chapter: str, scratch: Path) -> BuildError | None:
    try:
        generate_release(chapter, scratch)
    except BuildError as error:
        error.chapter = chapter
        return error
    return None


def _content(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def stale_files() -> list[str]:
    """Committed derived files (notebooks, and chapter 6's copied stubs) that differ from a
    fresh build (empty when all are fresh)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        stale = [
            str(paths.chapter_source(chapter).relative_to(paths.REPO))
            for chapter in graded_chapters()
            if stub_copies.stale(chapter)
        ]
        for fresh in build(root, refresh_sources=False):
            committed = paths.COURSE_ROOT / fresh.relative_to(root)
            if _content(committed) != _content(fresh):
                stale.append(str(committed.relative_to(paths.REPO)))
        return stale

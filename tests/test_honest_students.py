"""No honest student loses a point to the delegation rules: the reference answers, in a
notebook a student tinkered with (a harmless line in every cell, the course's read-only
cells included; Colab set-up cells; scratch cells with threads, processes, the profiler
and PyTorch's own attention), earn full marks, graded directly and through nbgrader."""

import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from autograder import paths
from autograder.grading.grade import grade_many, restored
from autograder.grading.judging.spec import load_chapter_tests
from autograder.grading.running.student_code import StudentCode, is_course_cell
from tests.notebooks import (
    CHAPTERS,
    honest_notebook,
    student_notebook,
    user_environment,
    write,
)

NBGRADER_CHAPTER = "08_efficient_attention"


def _grade_id(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def test_course_cells_are_read_only_in_the_release():
    """Every code cell but the exercises' is an nbgrader read-only cell."""
    for chapter in CHAPTERS:
        for cell in student_notebook(chapter).cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.cell_type == "code" and not meta.get("solution"):
                assert meta.get("locked") and meta.get("grade_id"), (chapter, cell.id)


def test_edited_and_deleted_course_cells_are_restored_and_never_read():
    chapter = "07_relative_position"
    nb = honest_notebook(chapter)
    course = [i for i, c in enumerate(nb.cells) if is_course_cell(c)]
    deleted = _grade_id(nb.cells[course[1]])
    del nb.cells[course[1]]
    edited = {c.source for c in nb.cells if is_course_cell(c)}
    forged = nbformat.v4.new_code_cell("import ctypes  # mine")
    forged.metadata["nbgrader"] = {"locked": True, "grade_id": "not_the_courses"}
    nb.cells.append(forged)
    restored_nb = restored(nb, chapter)
    release = {_grade_id(c): c.source for c in student_notebook(chapter).cells}
    ids = [_grade_id(c) for c in restored_nb.cells]
    before = _grade_id(nb.cells[course[0]])  # put back where it was
    assert ids.index(deleted) == ids.index(before) + 1
    for cell in restored_nb.cells:
        if is_course_cell(cell):
            assert cell.source == release[_grade_id(cell)]
    read = StudentCode.of_notebook(restored_nb, chapter).cells
    assert len(edited) > 10 and not edited & set(read)
    assert "import ctypes  # mine" in read  # a forged read-only cell is the student's


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("honest")
    notebooks = [write(honest_notebook(c), folder / f"{c}.ipynb") for c in CHAPTERS]
    before = _open_files()
    results = dict(zip(CHAPTERS, grade_many(notebooks, jobs=2, seed=0), strict=True))
    FILES_LEFT_OPEN.append(_open_files() - before)
    return results


FILES_LEFT_OPEN = []  # by the batch that graded the honest notebooks


@pytest.mark.slow
def test_a_batch_leaves_no_files_open_per_notebook(graded):
    """Each graded notebook's kernel client is closed (nbclient leaves it open when it did
    not start the kernel: about a dozen descriptors a notebook, so a class of 500 graded in
    one process ran out of them). What the batch itself keeps (its threads' event loops)
    does not grow with the class."""
    (left,) = FILES_LEFT_OPEN
    assert left < 2 * len(CHAPTERS), (
        f"{left} descriptors left open by {len(CHAPTERS)} notebooks"
    )


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_an_honest_tinkerer_earns_full_marks(graded, chapter):
    result = graded[chapter]
    assert result["assignment"] == chapter
    failed = [t for t in result["tests"] if not t["passed"]]
    assert not failed, failed
    assert result["score"] == result["max_score"] > 0
    assert result["flags"] == [], result["flags"]  # nothing for review either


def _compiled(source: str) -> str:
    """An answer, then the same function wrapped in ``torch.compile``."""
    if "def scaled_dot_product_attention(" not in source:
        return source
    return (
        source + "\n\nimport torch\n"
        "scaled_dot_product_attention = torch.compile(scaled_dot_product_attention)\n"
    )


@pytest.mark.slow
def test_an_answer_wrapped_in_torch_compile_earns_full_marks(tmp_path):
    """Grading compiles nothing: the compiled answer runs as written, in the student's
    cells and in the sealed tests (inductor would build native code that the jail's
    noexec folders cannot load: 2/10, with minutes of timeouts, before the jail ran
    compiled functions eagerly)."""
    chapter = "03_self_attention"
    notebook = write(
        student_notebook(chapter, _compiled), tmp_path / f"{chapter}.ipynb"
    )
    (result,) = grade_many([notebook], jobs=1, seed=0)
    failed = [t for t in result["tests"] if not t["passed"]]
    assert not failed, failed
    assert result["score"] == result["max_score"] > 0
    assert result["flags"] == [], result["flags"]


@pytest.mark.slow
def test_an_honest_tinkerer_earns_full_marks_through_nbgrader(tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(paths.COURSE_ROOT / "nbgrader_config.py", root)
    shutil.copytree(paths.COURSE_ROOT / "source", root / "source")
    folder = root / "submitted" / "alice" / NBGRADER_CHAPTER
    folder.mkdir(parents=True)
    write(honest_notebook(NBGRADER_CHAPTER), folder / f"{NBGRADER_CHAPTER}.ipynb")
    env = user_environment(PYTHONPATH=str(paths.REPO))
    for args in (
        ("db", "student", "add", "alice"),
        ("generate_assignment", NBGRADER_CHAPTER, "--force"),
        ("autograde", NBGRADER_CHAPTER, "--force"),
        ("export",),
    ):
        run = subprocess.run(
            [sys.executable, "-m", "nbgrader", *args], cwd=root, env=env,
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    header, row = (root / "grades.csv").read_text().splitlines()[:2]
    grades = dict(zip(header.split(","), row.split(","), strict=True))
    points = sum(t.points for t in load_chapter_tests(NBGRADER_CHAPTER).tests)
    assert float(grades["raw_score"]) == float(grades["max_score"]) == points > 0

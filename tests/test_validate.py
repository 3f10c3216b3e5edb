"""A student's Validate (``nbgrader validate``, the Validate button in Jupyter) says what
the visible checks say (issue 24): it fails on the untouched notebook and on a mistake the
checks catch, passes on a right one, and takes no message on stderr for a failure.

The course config (``autograder/course/nbgrader_config.py``) and a machine-wide student
config that loads ``validate_settings.py`` as a config file (as ``/etc/jupyter`` does on a
shared machine) are both tried, one per chapter. A mistake's notebook ends after its
exercise's visible checks: what follows cannot make them pass, and is not run twice."""

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import nbformat
import pytest

from autograder import paths
from tests.notebooks import release_notebook, student_notebook, write

pytestmark = pytest.mark.slow
SETTINGS = paths.REPO / "autograder" / "grading" / "recording" / "validate_settings.py"
PASSED = "Success! Your notebook passes all the tests."
FAILED = "VALIDATION FAILED ON"
# Mistakes each chapter's visible checks catch: (exercise, find, replace in its answer)
MISTAKES = {
    "01_bottleneck": [
        ("softmax", "return exp / exp.sum(dim=dim, keepdim=True)", "return exp"),
        ("softmax", "x - x.amax(dim=dim, keepdim=True)", "x"),  # overflows
    ],
    "03_self_attention": [
        ("scaled_dot_product_attention", " / math.sqrt(d_k)", ""),  # unscaled
        (
            "scaled_dot_product_attention",
            "softmax(scores, dim=-1)",
            "softmax(scores, dim=-2)",
        ),
    ],
}
# tqdm, a warning and a print to stderr: messages, not failures
STDERR_CELL = """
import sys, warnings
from tqdm import tqdm
for _ in tqdm(range(3), file=sys.stderr):
    pass
warnings.warn("only a warning")
print("a note on stderr", file=sys.stderr)
"""


def _student_config(folder):
    """A machine-wide student config as on a shared machine: only the settings file."""
    folder.mkdir(exist_ok=True)
    (folder / "nbgrader_config.py").write_text(
        f"c = get_config()\nload_subconfig({str(SETTINGS)!r})\n"
    )
    return folder


def _validate(notebook, config_folder) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "nbgrader", "validate", str(notebook)],
        cwd=config_folder, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert PASSED in run.stdout or FAILED in run.stdout, run.stdout + run.stderr
    return run.stdout


def _with_mistake(chapter: str, exercise: str, find: str, replace: str):
    """The right notebook with a mistake, up to that exercise's visible checks."""
    nb = student_notebook(chapter)
    ids = [c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells]
    answer = nb.cells[ids.index(f"exercise_{exercise}")]
    assert find in answer.source
    answer.source = answer.source.replace(find, replace)
    nb.cells = nb.cells[: ids.index(f"checks_{exercise}") + 1]
    return nb


@pytest.mark.parametrize("chapter", ["01_bottleneck", "03_self_attention"])
def test_validate_fails_untouched_and_wrong_notebooks_and_passes_a_right_one(
    chapter, tmp_path
):
    if chapter == "01_bottleneck":
        config = paths.COURSE_ROOT  # an instructor's or a student's course folder
    else:
        config = _student_config(tmp_path / "etc")
    notebooks = [write(release_notebook(chapter), tmp_path / "a.ipynb")]
    for i, (exercise, *edit) in enumerate(MISTAKES[chapter]):
        nb = _with_mistake(chapter, exercise, *edit)
        notebooks.append(write(nb, tmp_path / f"wrong{i}.ipynb"))
    notebooks.append(write(student_notebook(chapter), tmp_path / "c.ipynb"))
    # each validation is a process of its own: two at a time
    with ThreadPoolExecutor(2) as pool:
        untouched, *wrongs, right = pool.map(lambda n: _validate(n, config), notebooks)
    assert FAILED in untouched and "NotImplementedError" in untouched
    for (exercise, *_), wrong in zip(MISTAKES[chapter], wrongs, strict=True):
        assert FAILED in wrong and f"after filling in {exercise}" in wrong, wrong
    assert PASSED in right, right


def test_messages_on_stderr_are_no_failure(tmp_path):
    """With the course's settings a cell that writes a progress bar, a warning and a
    line to stderr passes; with nbgrader's own (all cells checked, stderr a failure),
    the test of the test, it fails."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(STDERR_CELL)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    notebook = write(nb, tmp_path / "stderr.ipynb")
    course = _student_config(tmp_path / "etc")
    assert PASSED in _validate(notebook, course)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "nbgrader_config.py").write_text(
        "get_config().Validator.validate_all = True\n"
    )
    assert FAILED in _validate(notebook, plain)

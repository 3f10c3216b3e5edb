"""Every chapter through the real grader, as an instructor would run it on a class: the
filled-in notebook earns full marks and runs without a problem (its ``demo`` cells, the
training runs and benchmarks, are skipped), and the untouched student notebook earns zero.

One batch holds both notebooks of every chapter, without ``--assignment``: the grader
recognises each chapter from its cells. The grader is started from a login shell's
environment, never the test process's own (``test_grader_environment`` shows this test
failing on a jail that imported Triton with its interpreter off).
"""

import json
import subprocess
import sys

import pytest

from autograder import paths
from tests.notebooks import (
    CHAPTERS,
    class_course,
    release_notebook,
    student_notebook,
    user_environment,
    write,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[tuple[str, str], dict]:
    folder = tmp_path_factory.mktemp("class")
    notebooks = {}
    for chapter in CHAPTERS:
        notebooks[chapter, "filled"] = write(
            student_notebook(chapter), folder / f"{chapter}_filled.ipynb"
        )
        notebooks[chapter, "stub"] = write(
            release_notebook(chapter), folder / f"{chapter}_stub.ipynb"
        )
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", *map(str, notebooks.values())]
        + ["--json", "--jobs", "2"],
        cwd=paths.REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env=user_environment(),  # a fresh shell's, as an instructor starts it
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["notebook"] for r in results] == [str(p) for p in notebooks.values()]
    return dict(zip(notebooks, results, strict=True))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_filled_in_notebook_earns_full_marks_without_a_problem(graded, chapter):
    result = graded[chapter, "filled"]
    assert result["assignment"] == chapter
    failed = [t for t in result["tests"] if not t["passed"]]
    assert not failed, failed
    assert result["score"] == result["max_score"] > 0
    # a demo cell that defined something the rest needs would show up here
    assert "problem" not in result["message"], result["message"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_untouched_student_notebook_earns_zero(graded, chapter):
    result = graded[chapter, "stub"]
    assert result["assignment"] == chapter
    assert result["score"] == 0
    assert all(t["message"] for t in result["tests"]), "every failure says why"


@pytest.fixture(scope="module")
def autograded(tmp_path_factory) -> dict[tuple[str, str], dict]:
    """Every chapter as a small class (a filled-in and an untouched notebook) through
    ``python -m autograder autograde``, in one course root, each started as an
    instructor starts it: from a login shell's environment."""
    root = tmp_path_factory.mktemp("autograde") / "course"
    for chapter in CHAPTERS:
        class_course(
            root,
            chapter,
            {
                "filled": lambda c=chapter: student_notebook(c),
                "stub": lambda c=chapter: release_notebook(c),
            },
            exist_ok=True,
        )
    found = {}
    for chapter in CHAPTERS:
        results = root / f"{chapter}.jsonl"
        run = subprocess.run(
            [sys.executable, "-m", "autograder", "autograde", chapter, "--jobs", "2",
             "--course-dir", str(root), "--results", str(results)],
            cwd=paths.REPO, capture_output=True, text=True, timeout=900,
            env=user_environment(PYTHONPATH=str(paths.REPO)),
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        for line in results.read_text().splitlines():
            result = json.loads(line)
            found[chapter, result["student"]] = result
    return found


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_class_run_gives_the_filled_in_notebook_full_marks_and_the_stub_zero(
    autograded, chapter
):
    filled, stub = autograded[chapter, "filled"], autograded[chapter, "stub"]
    assert filled["score"] == filled["max_score"] > 0, filled
    assert stub["score"] == 0 and stub["max_score"] == filled["max_score"], stub

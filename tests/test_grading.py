"""End to end: the grading command on real notebooks, good, wrong, broken and hostile."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from autograder import paths
from autograder.grading.recording.provenance import assignment_digest
from tests.notebooks import (
    grade_cli,
    release_notebook,
    scores_by_test,
    student_notebook,
    user_environment,
    with_extra_cell,
    write,
)

pytestmark = pytest.mark.slow
CHAPTER = "03_self_attention"


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """One batch of submissions graded together, as an instructor would."""
    d = tmp_path_factory.mktemp("submissions")
    good = student_notebook(CHAPTER)
    notebooks = {
        "filled": write(good, d / "filled.ipynb"),
        "stub": write(release_notebook(CHAPTER), d / "stub.ipynb"),
        "unscaled": write(
            student_notebook(CHAPTER, lambda s: s.replace(" / math.sqrt(d_k)", "")),
            d / "unscaled.ipynb",
        ),
        "renamed": write(
            student_notebook(
                CHAPTER,
                lambda s: s.replace("def causal_mask(", "def make_causal_mask("),
            ),
            d / "renamed.ipynb",
        ),
        "hangs_in_cell": write(
            with_extra_cell(
                student_notebook(CHAPTER),
                "while True:\n    pass",
                "exercise_causal_mask",
            ),
            d / "loop.ipynb",
        ),
        "hangs_before_def": write(
            student_notebook(
                CHAPTER,
                lambda s: s.replace(
                    "def scaled_dot_product_attention(",
                    "while True:\n    pass\n\n\ndef scaled_dot_product_attention(",
                ),
            ),
            d / "loop_before_def.ipynb",
        ),
        "hangs_in_function": write(
            student_notebook(
                CHAPTER,
                lambda s: s.replace(
                    "    d_k = q.size(-1)\n", "    while True:\n        pass\n"
                ),
            ),
            d / "hangs.ipynb",
        ),
        "sys_exit_in_function": write(
            student_notebook(
                CHAPTER,
                lambda s: s.replace(
                    "    d_k = q.size(-1)\n", "    raise SystemExit(0)\n"
                ),
            ),
            d / "sysexit.ipynb",
        ),
        "os_exit_in_function": write(
            student_notebook(
                CHAPTER,
                lambda s: s.replace(  # dies on a size only the hidden test uses
                    "    return torch.ones(n, n, dtype=torch.bool, device=device).tril()",
                    "    if n == 8:\n        import os\n\n        os._exit(3)\n"
                    "    return torch.ones(n, n, dtype=torch.bool, device=device).tril()",
                ),
            ),
            d / "exit_in_function.ipynb",
        ),
        "os_exit": write(
            with_extra_cell(
                student_notebook(CHAPTER),
                "import os\nos._exit(3)",
                "exercise_SelfAttention",
            ),
            d / "exit.ipynb",
        ),
    }
    notebooks["memory_hog"] = write(
        with_extra_cell(
            student_notebook(CHAPTER),
            # address space, not touched pages: the limit is reached at once
            "def hog():\n    kept = []\n    while True:\n"
            "        kept.append(torch.empty(2**30, dtype=torch.uint8))\nhog()",
            "exercise_causal_mask",
        ),
        d / "hog.ipynb",
    )
    notebooks["output_flood"] = write(
        with_extra_cell(
            student_notebook(CHAPTER),
            "for i in range(10**7):\n    print('x' * 1000)",
            "exercise_causal_mask",
        ),
        d / "flood.ipynb",
    )
    (d / "truncated.ipynb").write_text((d / "filled.ipynb").read_text()[:5000])
    notebooks["truncated"] = d / "truncated.ipynb"
    (d / "notes.txt").write_text("not a notebook")
    notebooks["not_a_notebook"] = d / "notes.txt"
    notebooks["missing_file"] = d / "does_not_exist.ipynb"
    run = grade_cli(
        *notebooks.values(),
        "--assignment", CHAPTER, "--json", "--jobs", "2",
        "--cell-timeout", "6", "--test-timeout", "5", "--timeout", "120",
        "--memory-mb", "4096", "--output-mb", "2",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["notebook"] for r in results] == [str(p) for p in notebooks.values()]
    return dict(zip(notebooks, results, strict=True))


def test_every_result_has_the_assignments_max_score(batch):
    digest = assignment_digest(CHAPTER)
    for name, result in batch.items():
        assert result["max_score"] == 10.0, name
        assert result["assignment"] == CHAPTER
        assert {"notebook", "assignment", "score", "max_score", "tests"} <= set(result)
        # what graded it: the course version and the digest of the tests, references
        # and tolerances (also for a notebook that could not be read)
        assert result["course_version"] == paths.course_version(), name
        assert result["digest"] == digest, name
        for t in result["tests"]:
            assert {"id", "score", "max_score", "passed", "message"} <= set(t)


def test_filled_in_notebook_gets_full_marks(batch):
    assert batch["filled"]["score"] == 10.0
    assert all(t["passed"] for t in batch["filled"]["tests"])


def test_untouched_student_notebook_gets_zero(batch):
    assert batch["stub"]["score"] == 0.0
    assert all("not implemented yet" in t["message"] for t in batch["stub"]["tests"])


def test_wrong_answer_loses_its_points_and_is_named(batch):
    result = batch["unscaled"]
    scores = scores_by_test(result)
    assert scores["causal_mask_values"] == 1.0 and scores["padding_mask_values"] == 1.0
    assert (
        scores["sdpa_basic"]
        == scores["sdpa_masked"]
        == scores["sdpa_edge_cases"]
        == 0.0
    )
    # SelfAttention calls the unscaled attention, and is right itself: with the course's
    # scaled_dot_product_attention standing in, it passes (one mistake, charged once)
    assert scores["self_attention_module"] == 2.0
    messages = " ".join(t["message"] for t in result["tests"])
    assert "did you divide q k^T by sqrt(d_k)?" in messages
    assert "Fix `scaled_dot_product_attention` first" in messages


def test_missing_function_is_reported(batch):
    result = batch["renamed"]
    assert scores_by_test(result)["causal_mask_values"] == 0.0
    assert result["score"] == 9.0
    causal = next(t for t in result["tests"] if t["id"] == "causal_mask_values")
    assert "does not define `causal_mask`" in causal["message"]


def test_infinite_loop_in_a_cell_is_interrupted_and_the_rest_graded(batch):
    result = batch["hangs_in_cell"]
    assert result["score"] == 10.0
    assert "time limit" in result["message"]


def test_a_time_limit_names_the_cell_that_ran_too_long(batch):
    """A cell interrupted at its time limit before it defined the exercise: the tests
    that found the exercise missing name that cell, not only the missing name (issue 43);
    a test that fails for another reason, or passes, says nothing of it."""
    result = batch["hangs_before_def"]
    scores = scores_by_test(result)
    assert scores["causal_mask_values"] == 1.0 and scores["sdpa_basic"] == 0.0
    sdpa = next(t for t in result["tests"] if t["id"] == "sdpa_basic")["message"]
    cell = re.search(r"code cell (\d+) ran past its time limit", result["message"])
    assert cell, result["message"]
    assert "does not define `scaled_dot_product_attention`" in sdpa
    assert f"Code cell {cell.group(1)} of your notebook ran past its time limit" in sdpa
    assert "6 s a cell" in sdpa
    for name in ("hangs_in_cell", "unscaled", "hangs_in_function"):
        for test in batch[name]["tests"]:
            assert "of your notebook ran past its time limit" not in test["message"]


def test_infinite_loop_in_a_function_fails_only_its_tests(batch):
    scores = scores_by_test(batch["hangs_in_function"])
    assert scores["causal_mask_values"] == 1.0 and scores["padding_mask_values"] == 1.0
    assert scores["sdpa_basic"] == 0.0


def test_system_exit_in_a_function_is_an_error_not_a_crash(batch):
    result = batch["sys_exit_in_function"]
    assert scores_by_test(result)["causal_mask_values"] == 1.0
    assert (
        "SystemExit"
        in next(t for t in result["tests"] if t["id"] == "sdpa_basic")["message"]
    )


def test_kernel_death_gives_zero_and_says_why(batch):
    result = batch["os_exit"]
    assert result["score"] == 0.0
    assert "kernel died" in result["message"]


def test_kernel_death_inside_a_test_costs_only_the_tests_it_did_not_finish(batch):
    # The death comes in a test of causal_mask, which runs in the first phase (it allows
    # PyTorch's attention); the tests that forbid it were to run after the guard is armed,
    # so they were not reached: they fail with the reason, and the student's doing is no
    # grader fault (the notebook is graded).
    result = batch["os_exit_in_function"]
    assert result["graded"], result["message"]
    scores = scores_by_test(result)
    assert scores["causal_mask_values"] == 0.0
    for test_id in (
        "sdpa_basic",
        "sdpa_masked",
        "sdpa_edge_cases",
        "self_attention_module",
    ):
        later = next(t for t in result["tests"] if t["id"] == test_id)
        assert later["score"] == 0.0
        assert "kernel died while the hidden tests called your code" in later["message"]


def test_memory_exhaustion_is_an_error_and_the_rest_is_graded(batch):
    result = batch["memory_hog"]
    assert result["score"] == 10.0, result
    assert re.search(r"memory|MemoryError", result["message"]), result["message"]


def test_a_flood_of_output_is_interrupted_and_the_rest_is_graded(batch):
    result = batch["output_flood"]
    assert result["score"] == 10.0, result
    assert "printed more than 2 MB" in result["message"], result["message"]


@pytest.mark.parametrize("name", ["truncated", "not_a_notebook", "missing_file"])
def test_unreadable_submissions_get_a_message(batch, name):
    result = batch[name]
    assert result["score"] == 0.0 and "could not read" in result["message"]


def test_chapter_is_recognised_without_assignment(tmp_path):
    path = write(student_notebook(CHAPTER), tmp_path / "My homework (final) v2.ipynb")
    run = grade_cli(path, "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["assignment"] == CHAPTER and result["score"] == 10.0
    assert result["digest"] == assignment_digest(CHAPTER)
    assert result["course_version"] == paths.course_version()
    human = grade_cli(path, "--assignment", CHAPTER)  # the summary line says it too
    assert (
        f"course version {paths.course_version()}, digest {assignment_digest(CHAPTER)[:12]}"
        in human.stdout
    )


def test_unknown_assignment_is_a_usage_error(tmp_path):
    run = grade_cli(tmp_path / "x.ipynb", "--assignment", "99_nothing")
    assert run.returncode == 2 and "unknown assignment" in run.stderr


def test_nbgrader_config_loads(tmp_path):
    """nbgrader ignores a config file that raises, so load it the way nbgrader does."""
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(
        "nbgrader_config.py", path=str(paths.COURSE_ROOT)
    ).load_config()
    assert config.CourseDirectory.root == str(paths.COURSE_ROOT)
    assert len(config.GenerateFeedback.preprocessors) == 3


def test_nbgrader_workflow(tmp_path):
    """An instructor's nbgrader path in a copy of the course root: autograde (in the
    sandbox), feedback, export; tricks that fool plain nbgrader earn nothing here."""
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(paths.COURSE_ROOT / "nbgrader_config.py", root)
    shutil.copytree(paths.COURSE_ROOT / "source", root / "source")
    env = user_environment(PYTHONPATH=str(paths.REPO))

    def nbgrader(*args):
        run = subprocess.run(
            [sys.executable, "-m", "nbgrader", *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        return run

    for student in ("alice", "bob", "carol", "dave"):
        nbgrader("db", "student", "add", student)
    nbgrader("generate_assignment", CHAPTER, "--force")
    from tests.attack_cells import PATCH_COMPARISONS, STEAL, stub_with_cell

    unscaled = student_notebook(CHAPTER, lambda s: s.replace(" / math.sqrt(d_k)", ""))
    for student, nb in [
        ("alice", student_notebook(CHAPTER)),
        ("bob", release_notebook(CHAPTER)),
        (
            "carol",
            with_extra_cell(unscaled, PATCH_COMPARISONS, "exercise_SelfAttention"),
        ),
        ("dave", stub_with_cell(STEAL)),
    ]:
        folder = root / "submitted" / student / CHAPTER
        folder.mkdir(parents=True)
        write(nb, folder / f"{CHAPTER}.ipynb")
    nbgrader("autograde", CHAPTER, "--force")
    nbgrader("generate_feedback", CHAPTER, "--force")
    nbgrader("export")
    grades = (root / "grades.csv").read_text().splitlines()
    header = grades[0].split(",")
    rows = {r.split(",")[header.index("student_id")]: r.split(",") for r in grades[1:]}
    assert float(rows["alice"][header.index("raw_score")]) == 10.0
    assert float(rows["bob"][header.index("raw_score")]) == 0.0
    assert float(rows["carol"][header.index("raw_score")]) == 4.0  # unscaled, no more
    assert float(rows["dave"][header.index("raw_score")]) == 0.0
    feedback = (root / "feedback" / "bob" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert (
        "not implemented yet" in feedback
    )  # the failing tests' messages reach the student
    # Feedback shows the verdicts, never the hidden tests' code
    text = re.sub(r"<[^>]+>", "", feedback)
    assert "HiddenTestFailed" in text and "run_hidden_test" not in text

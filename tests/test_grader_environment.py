"""The grader grades the same whatever environment it is started from.

Main at 90238c3 gave every honest chapter 11 notebook 0/8 when graded from a fresh shell:
the jail's warm process inherited the grader's environment, imported Triton (through
``torch._dynamo``) with its interpreter off, and every kernel forked from it called
compiled-mode ``tl.sum``. The suite never saw it, because the grader it started inherited
the test process's own environment, where importing the course's solutions had switched
the interpreter on. Now the warm process starts with the kernel's own environment
(``zygote.warm_environment``), the preflight proves a Triton kernel in a jailed kernel,
and the suite starts the grader from a login shell's environment
(``tests.notebooks.user_environment``).
"""

import json
import subprocess
import sys

import pytest

from autograder import paths
from autograder.grading.running import preflight
from autograder.grading.running.limits import Limits
from autograder.grading.running.sandbox import Sandbox, SandboxUnavailable, zygote
from tests.notebooks import student_notebook, user_environment, write

pytestmark = pytest.mark.slow
CHAPTER = "11_kernels"


def _as_at_90238c3(monkeypatch):
    """The warm process started with the interpreter off, as main at 90238c3 did from a
    fresh shell (the kernels themselves had ``TRITON_INTERPRET=1``, too late)."""
    settled = zygote.warm_environment

    def inherited(config, grader_environment):
        env = settled(config, grader_environment)
        del env["TRITON_INTERPRET"]
        return env

    monkeypatch.setattr(zygote, "warm_environment", inherited)


def test_the_login_environment_is_not_the_test_process_s():
    env = user_environment()
    assert "TRITON_INTERPRET" not in env  # set in this process by the course's imports
    assert "PATH" in env and "HOME" in env


def test_a_jail_whose_triton_is_compiled_grades_nothing(monkeypatch, tmp_path):
    """The preflight refuses the jail of 90238c3, with the cause; and what it prevents:
    without the preflight that jail gives the filled-in chapter 11 notebook zero, which
    is how ``test_every_chapter_grades`` would have failed on that regression."""
    from autograder.grading.grade import grade_many

    _as_at_90238c3(monkeypatch)
    with Sandbox(Limits()) as sandbox:
        with pytest.raises(SandboxUnavailable, match="Triton's interpreter does not"):
            preflight.prove(sandbox)
    filled = write(student_notebook(CHAPTER), tmp_path / "filled.ipynb")
    monkeypatch.setattr(preflight, "prove", lambda *args: None)
    jail = Sandbox.for_notebooks([filled], Limits())  # as the class run starts it
    (result,) = grade_many([filled], CHAPTER, seed=1, sandbox=jail)
    assert result["max_score"] > 0 and result["score"] == 0
    assert "outside of the scope of a kernel" in json.dumps(result["tests"])


def test_a_hostile_environment_changes_no_grade(tmp_path):
    """The grader started with the interpreter switched off, other thread counts and a
    Triton cache it may not use still gives the filled-in chapter 11 notebook full
    marks: what the jail sees is settled before anything is imported."""
    filled = write(student_notebook(CHAPTER), tmp_path / "filled.ipynb")
    env = user_environment(
        TRITON_INTERPRET="0",
        OMP_NUM_THREADS="3",
        TRITON_CACHE_DIR=str(tmp_path / "nowhere"),
        TORCHDYNAMO_DISABLE="1",
    )
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", str(filled), "--json"],
        cwd=paths.REPO, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["score"] == result["max_score"] > 0, result["tests"]

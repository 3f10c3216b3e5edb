"""The code is formatted and linted by ruff (configured in pyproject.toml)."""

import subprocess
import sys

from autograder.paths import REPO


def _ruff(*args):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True
    )


def test_ruff_lint():
    run = _ruff("check", ".")
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_format():
    run = _ruff("format", "--check", ".")
    assert run.returncode == 0, run.stdout + run.stderr

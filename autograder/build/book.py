"""The command that builds the book, shared by ``python -m autograder book`` and the tests."""

import os
import sys
from pathlib import Path

from autograder.paths import REPO

# Every claim the prose makes about a demo's output (course_utils.claim) is checked as the
# chapter runs: a build whose run does not bear one out fails, rather than publish it.
STRICT_CLAIMS = {"COURSE_STRICT_CLAIMS": "1"}


def book_command(
    path_output: Path | None = None, rebuild_all: bool = False
) -> list[str]:
    """``jupyter-book build`` of the repository, warnings as errors."""
    # jupyter-book's console script sits beside this Python (a venv's bin/ or the user's).
    command = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(REPO)]
    if path_output is not None:
        command += ["--path-output", str(path_output)]
    command += ["--warningiserror", "--keep-going"]
    if rebuild_all:
        command.append("--all")
    return command


def book_env(**extra: str) -> dict[str, str]:
    """The environment of a book build: this one, with the claims checked."""
    return {**os.environ, **STRICT_CLAIMS, **extra}

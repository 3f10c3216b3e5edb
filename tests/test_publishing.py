"""The workflows that publish the book and run CI on GitHub, checked here since GitHub
itself does not run in CI: actionlint and zizmor pass, and they do what the README says."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autograder.paths import REPO

WORKFLOWS = REPO / ".github" / "workflows"


def _tool(name: str) -> str:
    # console scripts sit beside this Python (a venv's bin/), or on PATH
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name) or name


def _workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


LINTERS = [["actionlint"], ["zizmor", "--offline"]]
# A step that runs a pull request's title as shell code: both linters must refuse it.
INJECTABLE = """\
name: Bad
on: pull_request
permissions: {}
jobs:
  greet:
    runs-on: ubuntu-latest
    steps:
      - run: echo "${{ github.event.pull_request.title }}"
"""


def _lint(tool: list[str], paths: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_tool(tool[0]), *tool[1:], *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("tool", LINTERS)
def test_the_workflows_pass_the_linters(tool):
    run = _lint(tool, sorted(WORKFLOWS.glob("*.yml")))
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("tool", LINTERS)
def test_the_linters_refuse_a_script_injection(tool, tmp_path):
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(INJECTABLE)
    assert _lint(tool, [bad]).returncode != 0


def test_the_book_deploys_from_main_only_with_least_permissions():
    book = _workflow("book.yml")
    triggers = book[True]  # YAML 1.1 reads the key "on" as True
    assert triggers["push"]["branches"] == ["main"] and "pull_request" in triggers
    assert book["permissions"] == {}
    build, deploy = book["jobs"]["build"], book["jobs"]["deploy"]
    assert build["permissions"] == {"contents": "read"}
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["if"] == (
        "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    )
    assert deploy["concurrency"] == {"group": "pages", "cancel-in-progress": False}
    steps = " ".join(str(step) for step in build["steps"])
    # the site is kept as an artifact on every run (pull requests included)
    assert "upload-pages-artifact" in steps and "_build/html" in steps
    # myst-nb's execution cache, where the book build keeps it
    cache = next(s for s in build["steps"] if "actions/cache" in s.get("uses", ""))
    assert cache["with"]["path"] == "_build/.jupyter_cache"
    assert "python -m autograder book" in steps


def test_ci_runs_the_readmes_test_command():
    ci = _workflow("ci.yml")
    assert {"push", "pull_request"} <= set(ci[True])
    steps = [step.get("run", "") for step in ci["jobs"]["test"]["steps"]]
    assert "bash .ci/run" in steps
    assert "python -m pytest" in (REPO / ".ci" / "run").read_text()


def test_the_readme_names_the_address_that_follows_from_the_repository():
    """The book's address is derived from repository.url in _config.yml (book/_ext); the
    README's "For readers" opens with that address."""
    url = yaml.safe_load((REPO / "_config.yml").read_text())["repository"]["url"]
    org, repo = url.rstrip("/").split("/")[-2:]
    readme = (REPO / "README.md").read_text()
    readers = readme[readme.index("## For readers") :].split("\n## ")[0]
    first = readers.split("\n\n")[1]
    assert f"https://{org.lower()}.github.io/{repo}/" in first

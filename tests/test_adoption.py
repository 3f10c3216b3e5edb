"""A course others can adopt: every file licensed, a valid citation that matches the one
version, that version shown in every student notebook, and a change log that accounts for
every grade-changing change since the last release (with tests of those tests)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder import release
from autograder.grading.judging.spec import graded_chapters
from autograder.grading.recording.provenance import assignment_digest, digest_files
from autograder.paths import REPO, course_version, nbgrader_source, release_notebook

CONFIG = yaml.safe_load((REPO / "_config.yml").read_text())


def _tool(name: str) -> str:
    """A console script installed beside this Python (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed: see requirements-dev.txt"
    return found


def _run(*args, cwd=REPO):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


# --- 1. Licences ---------------------------------------------------------------------


def test_every_file_has_a_licence():
    run = _run(sys.executable, "-m", "reuse", "lint")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # the course's two, the theme's for the templates the book overrides, and the public
    # domain for chapter 10's text
    assert (
        "Used licenses: BSD-3-Clause, CC-BY-4.0, LicenseRef-PublicDomain, MIT"
        in run.stdout
    )


def _tracked_copy(tmp_path: Path) -> Path:
    """The repository's files as git has them (tracked or new, not ignored), no .git."""
    files = _run(
        "git", "ls-files", "--cached", "--others", "--exclude-standard"
    ).stdout.split("\n")
    copy = tmp_path / "repo"
    for name in filter(None, files):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    return copy


def test_a_file_under_neither_licence_fails_reuse_lint(tmp_path):
    copy = _tracked_copy(tmp_path)
    assert _run(sys.executable, "-m", "reuse", "lint", cwd=copy).returncode == 0
    (copy / "benchmarks" / "results.dat").write_text("a file no annotation covers\n")
    run = _run(sys.executable, "-m", "reuse", "lint", cwd=copy)
    assert run.returncode == 1 and "benchmarks/results.dat" in run.stdout


def test_licence_texts_and_the_readme_say_which_applies_to_what():
    texts = {p.name for p in (REPO / "LICENSES").iterdir()}
    # the course's two, the theme's, for the templates the book overrides, and the public
    # domain's, for chapter 10's text
    assert texts == {
        "CC-BY-4.0.txt",
        "MIT.txt",
        "BSD-3-Clause.txt",
        "LicenseRef-PublicDomain.txt",
    }
    cc = (REPO / "LICENSES" / "CC-BY-4.0.txt").read_text()
    assert "Creative Commons Attribution 4.0 International Public License" in cc
    assert "Section 8 -- Interpretation." in cc
    assert (
        "Permission is hereby granted, free of charge"
        in (REPO / "LICENSES" / "MIT.txt").read_text()
    )
    readme = (REPO / "README.md").read_text()
    licence = readme.split("## Licence", 1)[1].split("\n## ", 1)[0]
    assert "CC BY 4.0" in licence and "MIT" in licence
    for part in (
        "chapters/",
        "autograder/course/**/*.ipynb",
        "solutions",
        "autograder",
        "shakespeare.txt",
    ):
        assert part in licence


# --- 2. Citation ---------------------------------------------------------------------


def test_citation_cff_is_valid():
    run = _run(_tool("cffconvert"), "--validate", "-i", "CITATION.cff")
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_invalid_citation_cff_fails_validation(tmp_path):
    broken = (REPO / "CITATION.cff").read_text().replace("cff-version:", "cff-versio:")
    (tmp_path / "CITATION.cff").write_text(broken)
    run = _run(_tool("cffconvert"), "--validate", "-i", "CITATION.cff", cwd=tmp_path)
    assert run.returncode != 0


def test_citation_names_this_release_licences_and_repository():
    cff = release.citation()
    assert str(cff["version"]) == course_version()
    date, _ = release.releases((REPO / "CHANGELOG.md").read_text())[course_version()]
    assert str(cff["date-released"]) == date
    assert cff["repository-code"] == CONFIG["repository"]["url"]
    assert sorted(cff["license"]) == ["CC-BY-4.0", "MIT"]
    assert cff["authors"] == [{"name": "The attention-course authors"}]


@pytest.mark.parametrize("page", ["README.md", "book/about.md"])
def test_readme_and_book_cite_the_course_as_citation_cff_does(page):
    text = (REPO / page).read_text()
    assert re.search(r"^## Cite this course$", text, re.M)
    assert f"```bibtex\n{release.bibtex()}\n```" in text


# --- 3. Versions ---------------------------------------------------------------------


def test_the_version_is_semantic_and_released_in_the_change_log():
    assert re.fullmatch(r"\d+\.\d+\.\d+", course_version())
    found = release.releases((REPO / "CHANGELOG.md").read_text())
    assert "Unreleased" in found
    assert found[course_version()][0], (
        "the release needs a date: ## [X.Y.Z] - YYYY-MM-DD"
    )


@pytest.mark.parametrize("chapter", graded_chapters())
def test_every_notebook_names_the_course_version_first(chapter):
    for path in (release_notebook(chapter), nbgrader_source(chapter)):
        first = nbformat.read(path, as_version=4).cells[0]
        assert first.cell_type == "markdown"
        assert f"course version **{course_version()}**" in first.source, path


def test_the_change_log_accounts_for_every_grade_changing_change():
    assert release.problems() == []


def _course_copy(tmp_path: Path) -> Path:
    """What the change-log check reads: the grade-changing files, the change log, the
    version and the release record."""
    copy = tmp_path / "repo"
    for folder in ("solutions", "autograder/hidden_tests", "autograder/known_mistakes"):
        shutil.copytree(REPO / folder, copy / folder)
    for name in (
        "autograder/grading/judging/tolerances.py",
        "CHANGELOG.md",
        "VERSION",
        release.RECORD,
    ):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, copy / name)
    # as at a release of the files as they are: nothing unreleased yet, and the record
    # written for them (the tests add their own changes and entries)
    log = copy / "CHANGELOG.md"
    head, rest = log.read_text().split("## [Unreleased]\n", 1)
    log.write_text(head + "## [Unreleased]\n\n## [" + rest.split("\n## [", 1)[1])
    release.record(copy)
    return copy


def _unreleased(copy: Path, entry: str) -> None:
    path = copy / "CHANGELOG.md"
    path.write_text(
        path.read_text().replace(
            "## [Unreleased]\n", f"## [Unreleased]\n\n{entry}\n", 1
        )
    )


def test_a_changed_hidden_test_without_an_entry_fails_the_check(tmp_path):
    # chapter 9's hidden tests: no other chapter's digest includes them (chapter 6's, for
    # one, includes chapters 3 to 5's, which it runs again on its exercise 0)
    copy = _course_copy(tmp_path)
    assert release.problems(copy) == []
    tests = copy / "autograder" / "hidden_tests" / "beyond_sequences.py"
    tests.write_text(tests.read_text().replace("points=", "points=1 + ", 1))
    (problem,) = release.problems(copy)
    assert problem.startswith("09_beyond_sequences:")
    # an entry that does not change grades is not enough
    _unreleased(
        copy, "### 09_beyond_sequences\n\n#### Other\n\n- A clearer sentence.\n"
    )
    assert len(release.problems(copy)) == 1
    _unreleased(
        copy, "### 09_beyond_sequences\n\n#### Grade-changing\n\n- One more point.\n"
    )
    assert release.problems(copy) == []


def test_a_changed_tolerance_changes_every_assignment(tmp_path):
    copy = _course_copy(tmp_path)
    tolerances = copy / "autograder" / "grading" / "judging" / "tolerances.py"
    tolerances.write_text(tolerances.read_text().replace("rtol=1e-5", "rtol=2e-5"))
    assert len(release.problems(copy)) == len(graded_chapters())
    _unreleased(copy, "### All assignments\n\n#### Grade-changing\n\n- Looser `op`.\n")
    assert release.problems(copy) == []


def test_a_new_version_needs_its_release_recorded(tmp_path):
    copy = _course_copy(tmp_path)
    (copy / "VERSION").write_text("1.0.1\n")
    assert any("release.json records" in p for p in release.problems(copy))


def test_the_digest_covers_tests_references_mistakes_and_tolerances_only():
    files = digest_files("06_transformer")
    assert {
        "autograder/hidden_tests/transformer.py",
        "autograder/hidden_tests/_inputs.py",
        "autograder/known_mistakes/transformer.py",
        "solutions/transformer.py",
        "solutions/multi_head.py",  # imported by the reference: it grades too
        "autograder/grading/judging/tolerances.py",
    } <= set(files)
    assert not any(f.startswith("chapters/") for f in files)  # prose changes no grade
    record = json.loads((REPO / release.RECORD).read_text())
    # a chapter added since the last release has no digest recorded yet: its change-log
    # entry is checked like any changed one (release.problems), until the next release
    # records it
    assert set(record["digests"]) <= set(graded_chapters())
    assert release.problems(REPO) == []
    assert len({assignment_digest(c) for c in graded_chapters()}) == len(
        graded_chapters()
    )


def test_the_digest_follows_every_edit_though_it_is_computed_once(tmp_path):
    """A class run takes the digest from a cache: an edit to any file in it, or a new
    import, still changes it at once."""
    for rel in digest_files("03_self_attention"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    first = assignment_digest("03_self_attention", tmp_path)
    assert first == assignment_digest("03_self_attention", REPO)
    tolerances = tmp_path / "autograder/grading/judging/tolerances.py"
    tolerances.write_text(tolerances.read_text() + "# edited\n")
    edited = assignment_digest("03_self_attention", tmp_path)
    assert edited != first
    reference = tmp_path / "solutions/self_attention.py"
    extra = tmp_path / "solutions/extra.py"
    extra.write_text("X = 1\n")
    reference.write_text("import solutions.extra\n" + reference.read_text())
    assert "solutions/extra.py" in digest_files("03_self_attention", tmp_path)
    imported = assignment_digest("03_self_attention", tmp_path)
    assert imported not in (first, edited)
    extra.write_text("X = 2\n")  # a file the new import brought in counts too
    assert assignment_digest("03_self_attention", tmp_path) != imported


def test_release_and_check_print_the_version_and_digests(monkeypatch, capsys):
    from autograder.__main__ import main
    from autograder.grading.running import sandbox
    from autograder.grading.running.limits import Limits

    assert main(["release"]) == 0
    out = capsys.readouterr().out
    assert f"course version {course_version()}" in out
    assert assignment_digest("03_self_attention")[:12] in out

    class NoJail:
        def __init__(self, *args, **kwargs):
            raise sandbox.SandboxUnavailable("no jail in this test")

    # imported before the patch: a module that imports Sandbox by name while it is
    # patched would keep NoJail for the rest of the session
    from autograder.grading import grade  # noqa: F401
    from autograder.grading.check import check

    monkeypatch.setattr(sandbox, "Sandbox", NoJail)
    assert check(Limits()) == 3
    out = capsys.readouterr().out
    assert f"course version {course_version()}" in out
    for chapter in graded_chapters():
        assert f"{chapter}: {assignment_digest(chapter)}" in out


# --- 5. Contributing -----------------------------------------------------------------


def test_pre_commit_runs_local_hooks_only_and_what_ci_runs_quickly():
    run = _run(_tool("pre-commit"), "validate-config", ".pre-commit-config.yaml")
    assert run.returncode == 0, run.stdout + run.stderr
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    assert [r["repo"] for r in config["repos"]] == ["local"]
    entries = [h["entry"] for r in config["repos"] for h in r["hooks"]]
    for command in (
        "python -m ruff check",
        "python -m ruff format --check",
        "python -m autograder build --check",
        "python -m reuse lint",
    ):
        assert any(e.startswith(command) for e in entries), command


def test_contributing_covers_a_typo_a_known_mistake_and_an_exercise():
    text = (REPO / "CONTRIBUTING.md").read_text()
    for heading in ("## Fix a typo", "## Add a known mistake", "## Add an exercise"):
        assert heading in text
    for test in ("tests/test_hidden_tests.py", "tests/test_build.py"):
        assert test in text and (REPO / test).is_file()


# --- 4. Traceable grades (the end-to-end checks are in test_class_autograde.py) --------


def test_the_summary_names_regrades_under_another_digest_and_mixed_digests():
    from autograder.grading.recording.autograde import summary

    def result(student, digest):
        return {
            "student": student, "graded": True, "score": 1.0, "max_score": 1.0,
            "message": "", "course_version": "1.1.0", "digest": digest,
        }  # fmt: skip

    old, new = "a" * 64, "b" * 64
    previous = {
        "alice": {"course_version": "1.0.0", "digest": old},
        "bob": {"course_version": "1.1.0", "digest": new},
    }
    text = summary([result("alice", new), result("bob", new)], previous=previous)
    assert f"graded by: course version 1.1.0, digest {new[:12]}" in text
    assert re.search(r"re-graded under another digest +1", text)
    assert (
        f"RE-GRADED UNDER ANOTHER DIGEST alice: was course version 1.0.0, digest "
        f"{old[:12]}; now 1.1.0, digest {new[:12]}" in text
    )
    assert "RE-GRADED UNDER ANOTHER DIGEST bob" not in text  # same digest as before
    mixed = summary([result("alice", new), result("carol", old)])
    assert "different digests" in mixed

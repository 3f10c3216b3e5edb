"""Releases: the course version, the change log, and the digests recorded at the last release.

- The version is written once, in ``VERSION`` (``autograder.paths.course_version``).
- ``CHANGELOG.md`` lists each release's changes per assignment (``### 03_self_attention``,
  or ``### All assignments``), each split into ``#### Grade-changing`` and ``#### Other``.
- ``autograder/release.json`` records, for the last release, its version, date and each
  assignment's digest (``grading.provenance.assignment_digest``). It is derived:
  ``python -m autograder release --record`` writes it.
- :func:`problems` is the freshness check (``python -m autograder release``, and
  ``tests/test_adoption.py``): an assignment whose digest differs from the last release's
  needs a grade-changing entry under ``## [Unreleased]`` in the change log.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from autograder.paths import REPO

CHANGELOG = "CHANGELOG.md"
RECORD = "autograder/release.json"
CITATION = "CITATION.cff"
ALL = "All assignments"
GRADE_CHANGING = "Grade-changing"


def _sections(text: str, level: int) -> list[tuple[str, str]]:
    """``(heading, body)`` for each heading of exactly ``level`` ``#`` in ``text``, in
    order (a heading may appear twice)."""
    marks = "#" * level
    parts = re.split(rf"^{marks} +(.+?) *$", text, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts), 2)]


def releases(changelog: str) -> dict[str, tuple[str | None, str]]:
    """``{version: (date, body)}`` of the change log, ``Unreleased`` included (no date)."""
    found = {}
    for heading, body in _sections(changelog, 2):
        match = re.fullmatch(r"\[([^\]]+)\](?: +- +(\d{4}-\d\d-\d\d))?", heading)
        if match:
            found[match.group(1)] = (match.group(2), body)
    return found


def grade_changing(body: str) -> set[str]:
    """The assignments (or ``ALL``) with at least one entry under ``Grade-changing``."""
    found = set()
    for assignment, text in _sections(body, 3):
        for kind, entries in _sections(text, 4):
            if kind == GRADE_CHANGING and re.search(r"^\s*[-*] +\S", entries, re.M):
                found.add(assignment)
    return found


def current_digests(repo: Path = REPO) -> dict[str, str]:
    from autograder.grading.judging.spec import graded_chapters
    from autograder.grading.recording.provenance import assignment_digest

    return {c: assignment_digest(c, repo) for c in graded_chapters()}


def read_record(repo: Path = REPO) -> dict:
    path = repo / RECORD
    return json.loads(path.read_text()) if path.is_file() else {}


def record(repo: Path = REPO) -> Path:
    """Write ``autograder/release.json`` for the version in ``VERSION``: its date from the
    change log's heading for that version, and every assignment's digest now."""
    version = (repo / "VERSION").read_text().strip()
    found = releases((repo / CHANGELOG).read_text())
    if version not in found or found[version][0] is None:
        raise SystemExit(
            f"{CHANGELOG} has no '## [{version}] - YYYY-MM-DD' section for VERSION {version}"
        )
    data = {
        "version": version,
        "date": found[version][0],
        "digests": current_digests(repo),
    }
    path = repo / RECORD
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def problems(repo: Path = REPO, digests: dict[str, str] | None = None) -> list[str]:
    """Why the change log and the release record do not account for the grade-changing
    files as they are now (empty when they do)."""
    digests = current_digests(repo) if digests is None else digests
    version = (repo / "VERSION").read_text().strip()
    found = releases((repo / CHANGELOG).read_text())
    last = read_record(repo)
    out = []
    if not last:
        return [f"no {RECORD}: run `python -m autograder release --record`"]
    if last.get("version") != version:
        out.append(
            f"{RECORD} records release {last.get('version')} but VERSION is {version}: "
            "after cutting a release run `python -m autograder release --record`"
        )
    if version not in found:
        out.append(f"{CHANGELOG} has no section for VERSION {version}")
    entered = grade_changing(found.get("Unreleased", (None, ""))[1])
    for chapter, digest in digests.items():
        before = last.get("digests", {}).get(chapter)
        if digest != before and chapter not in entered and ALL not in entered:
            out.append(
                f"{chapter}: its grade-changing files differ from release "
                f"{last.get('version')} (digest {str(before)[:12]} -> {digest[:12]}) and "
                f"{CHANGELOG} has no '#### {GRADE_CHANGING}' entry for it under "
                "'## [Unreleased]' (### " + chapter + ")"
            )
    return out


def citation(repo: Path = REPO) -> dict:
    import yaml

    return yaml.safe_load((repo / CITATION).read_text())


def bibtex(repo: Path = REPO) -> str:
    """The course's BibTeX entry, made from ``CITATION.cff`` (README and the book's
    About page carry it; a test checks that they carry exactly this)."""
    cff = citation(repo)
    author = " and ".join(
        "{" + a["name"] + "}"
        if "name" in a
        else f"{a['family-names']}, {a['given-names']}"
        for a in cff["authors"]
    )
    year = str(cff["date-released"])[:4]
    return "\n".join(
        [
            "@misc{attention_course,",
            f"  author = {{{author}}},",
            f"  title = {{{{{cff['title']}}}}},",
            f"  version = {{{cff['version']}}},",
            f"  year = {{{year}}},",
            f"  url = {{{cff['repository-code']}}},",
            "}",
        ]
    )

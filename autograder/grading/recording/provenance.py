"""What graded a result: the course version and a digest of the files that decide an
assignment's grades, recorded with every grade so that a grade can be traced and reproduced.

:func:`assignment_digest` is the one function that computes the digest. It is a sha256
over exactly what decides an assignment's grades (:func:`digest_files`):

- its hidden tests, ``autograder/hidden_tests/<module>.py`` (the cases, points, tolerance
  levels, forbidden features);
- its reference, ``solutions/<module>.py`` (the expected outputs, and the signatures);
- its known mistakes, ``autograder/known_mistakes/<module>.py`` (what the feedback names);
- the tolerances, ``autograder/grading/judging/tolerances.py``;
- every module of ``solutions``, ``autograder.hidden_tests`` and
  ``autograder.known_mistakes`` that those import, transitively (``_inputs.py``, which
  draws the hidden inputs, for instance).

Each file counts by its path and its bytes. The grader's own machinery (the sandbox, the
judge) is not in the digest: it is the same for every assignment and is covered by the
course version, recorded beside the digest.

Where a grade is recorded: ``grade --json`` and the class results (``course_version``,
``digest``), the gradebook (the table ``autograder_provenance`` in ``gradebook.db``, beside
nbgrader's own tables: one row per assignment and student) and the feedback page (a
note at the top of the autograded notebook).
"""

from __future__ import annotations

import ast
import hashlib
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from autograder.grading.judging.delegation import READING_CODE
from autograder.paths import REPO, course_version, module_name

# Packages whose modules, when an included file imports them, are part of the digest.
_PACKAGES = ("solutions", "autograder.hidden_tests", "autograder.known_mistakes")
TOLERANCES = "autograder/grading/judging/tolerances.py"
TABLE = "autograder_provenance"  # in gradebook.db, beside nbgrader's tables


def _module_file(name: str, repo: Path) -> Path | None:
    if not name.startswith(_PACKAGES) or name in _PACKAGES:
        return None
    path = repo / (name.replace(".", "/") + ".py")
    return path if path.is_file() else None


def _imported_files(path: Path, repo: Path) -> set[Path]:
    """The course's own modules (in ``_PACKAGES``) that the file at ``path`` imports."""
    found = set()
    with READING_CODE:  # CPython 3.11's parser is not thread-safe (delegation.py)
        tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # ``from solutions import self_attention`` imports a module by its name
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            module = _module_file(name, repo)
            if module is not None:
                found.add(module)
    return found


def digest_files(chapter: str, repo: Path = REPO) -> list[str]:
    """The files that decide ``chapter``'s grades, relative to ``repo``, sorted."""
    name = module_name(chapter)
    start = [
        repo / "autograder" / "hidden_tests" / f"{name}.py",
        repo / "solutions" / f"{name}.py",
        repo / "autograder" / "known_mistakes" / f"{name}.py",
    ]
    todo = [p for p in start if p.is_file()]
    seen = set(todo)
    while todo:
        for module in _imported_files(todo.pop(), repo) - seen:
            seen.add(module)
            todo.append(module)
    seen.add(repo / TOLERANCES)
    return sorted(p.relative_to(repo).as_posix() for p in seen)


# (chapter, repo) -> (the stat of each file in its digest, the digest): a class run
# stamps every result with the same digest; parsing the files for their imports each
# time cost about 10 ms a notebook.
_DIGESTS: dict[tuple[str, Path], tuple[tuple, str]] = {}


def _stats(repo: Path, files: list[str]) -> tuple:
    """What changes when a file is edited, replaced or removed. A new import is an
    edit of a file already in the list, so the list itself is checked this way too."""
    out = []
    for rel in files:
        try:
            st = (repo / rel).stat()
            out.append((rel, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((rel, None))
    return tuple(out)


def assignment_digest(chapter: str, repo: Path = REPO) -> str:
    """sha256 (hex) of the files that decide ``chapter``'s grades: each file's path and
    the sha256 of its bytes, one line per file, in path order. Computed again only when
    one of those files has changed since the last call."""
    cached = _DIGESTS.get((chapter, repo))
    if cached is not None:
        stats, digest = cached
        if _stats(repo, [s[0] for s in stats]) == stats:
            return digest
    files = digest_files(chapter, repo)
    stats = _stats(repo, files)
    lines = []
    for rel in files:
        content = hashlib.sha256((repo / rel).read_bytes()).hexdigest()
        lines.append(f"{rel}\0{content}\n")
    digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    _DIGESTS[(chapter, repo)] = (stats, digest)
    return digest


def short(digest: str | None) -> str:
    """The first 12 hex digits, for people (results keep the whole digest)."""
    return digest[:12] if digest else "none"


def stamp(result: dict, chapter: str | None) -> None:
    """Put the course version and, once the assignment is known, its digest in a result."""
    result["course_version"] = course_version()
    result["digest"] = assignment_digest(chapter) if chapter else None


def describe(result: dict) -> str:
    return (
        f"course version {result.get('course_version') or 'unknown'}, "
        f"{result.get('assignment')} digest {short(result.get('digest'))}"
    )


# --- the gradebook's table ----------------------------------------------------------


def db_path(db_url: str) -> Path | None:
    """The file of an ``sqlite:///`` gradebook address (None for any other database)."""
    prefix = "sqlite:///"
    return Path(db_url[len(prefix) :]) if db_url.startswith(prefix) else None


def record_in_gradebook(
    db_url: str, assignment: str, student: str, result: dict
) -> None:
    """Write (or replace) the student's row in the gradebook's provenance table."""
    path = db_path(db_url)
    if path is None:
        return
    # several recording workers write at once: wait for the others' short writes
    with sqlite3.connect(path, timeout=60) as db:
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (assignment TEXT NOT NULL, "
            "student TEXT NOT NULL, course_version TEXT, digest TEXT, seed INTEGER, "
            "graded_at TEXT, flags TEXT, attempt TEXT, PRIMARY KEY (assignment, student))"
        )
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({TABLE})")}
        for column in ("flags", "attempt"):  # a gradebook from before them
            if column not in columns:
                db.execute(f"ALTER TABLE {TABLE} ADD COLUMN {column} TEXT")
        db.execute(
            f"INSERT OR REPLACE INTO {TABLE} (assignment, student, course_version, "
            "digest, seed, graded_at, flags, attempt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                assignment,
                student,
                result.get("course_version"),
                result.get("digest"),
                result.get("seed"),
                datetime.now(UTC).isoformat(timespec="seconds"),
                # for the instructor's review (``delegation.flags``): never a point
                json.dumps(result.get("flags") or []),
                # graded on submit: which attempt this is (its number, time, sha256)
                # and why the course keeps it (``on_submit.attempts.chosen``)
                json.dumps(result["attempt"]) if result.get("attempt") else None,
            ),
        )


def recorded(db_url_or_path: str | Path, assignment: str) -> dict[str, dict]:
    """``{student: row}`` of the provenance table for one assignment (empty when none)."""
    path = Path(db_url_or_path)
    if isinstance(db_url_or_path, str) and db_url_or_path.startswith("sqlite:///"):
        path = db_path(db_url_or_path)
    if not path.is_file():
        return {}
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        try:
            rows = db.execute(
                f"SELECT * FROM {TABLE} WHERE assignment = ?", (assignment,)
            ).fetchall()
        except sqlite3.OperationalError:  # no table yet: nothing graded here before
            return {}
    return {row["student"]: dict(row) for row in rows}


def regraded(previous: dict[str, dict], results: list[dict]) -> list[str]:
    """One line per student graded before under another digest than now."""
    lines = []
    for r in results:
        before = previous.get(r.get("student"))
        if r["graded"] and before and before["digest"] != r.get("digest"):
            lines.append(
                f"RE-GRADED UNDER ANOTHER DIGEST {r['student']}: was course version "
                f"{before['course_version']}, digest {short(before['digest'])}; now "
                f"{r.get('course_version')}, digest {short(r.get('digest'))}"
            )
    return lines


def feedback_note(result: dict) -> str:
    """The note at the top of the feedback page. Not the seed: a student who knew it
    could compute the hidden inputs of a later run that reused it (the gradebook's
    table keeps it for the instructor)."""
    return (
        f"*Graded by the course's autograder: course version "
        f"{result.get('course_version')}, hidden tests, reference and tolerances of "
        f"{result.get('assignment')} with digest `{result.get('digest')}`.*"
    )

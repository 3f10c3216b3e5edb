"""The exchange's inbound submissions: ``inbound/{student}+{assignment}+{time}+{random}``
as ``nbgrader submit`` names them, oldest first, and whether the login they name made
them (``owned_collect.foreign_owners``). A submission's time is when it reached the
exchange (``timestamps.arrived``: its files' change time, which the student cannot set
back), as the service first saw it (kept in its journal); never the time in the
folder's name or its ``timestamp.txt``, which the submitting student writes."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from autograder.grading.recording.owned_collect import foreign_owners, pwd


@dataclass(frozen=True)
class Submission:
    folder: Path
    student: str
    assignment: str
    timestamp: datetime  # UTC, naive

    @property
    def key(self) -> str:
        """The journal's name for it: the folder's, unique in the exchange."""
        return self.folder.name

    def notebook(self) -> Path:
        return self.folder / f"{self.assignment}.ipynb"


def inbound_path(exchange: Path, course_id: str) -> Path:
    return Path(exchange) / course_id / "inbound"


def waiting(inbound: Path, assignments, seen=None) -> list[Submission]:
    """Every complete submission of ``assignments`` in ``inbound``, oldest first (ties:
    by name). One still being copied (no ``submission_secret.txt`` yet, which nbgrader
    writes last) waits for the next look. Its time: ``seen(name)`` (the time the
    service took when it first saw it), else when it arrived."""
    from autograder.grading.recording.timestamps import arrived

    found = []
    try:
        names = os.listdir(inbound)
    except OSError:
        return found
    for name in names:
        parts = name.split("+")
        if len(parts) < 3 or parts[1] not in assignments:
            continue
        folder = inbound / name
        if not (folder / "submission_secret.txt").is_file():
            continue
        when = seen(name) if seen is not None else None
        if when is None:
            try:
                when = arrived(folder)
            except OSError:  # gone meanwhile
                continue
        found.append(Submission(folder, parts[0], parts[1], when))
    return sorted(found, key=lambda s: (s.timestamp, s.key))


def others_owning(submission: Submission) -> set[str]:
    """The logins other than the student it names that own it or a file in it (none
    where owners cannot be told apart)."""
    if pwd is None or sys.platform == "win32":
        return set()
    return foreign_owners(str(submission.folder), submission.student)

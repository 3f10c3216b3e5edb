"""What happened to each submission, one fsync'd JSON line per step, in the course root
(``on_submit/journal.jsonl``): ``started`` (grading began), then ``graded``, ``held``
(kept until the due date), ``refused`` (another login's files), ``fault`` (the grader
could not grade it: no attempt used) or ``recorded``. A
submission whose last line is ``started`` was cut off (a crash): it is graded again. One
with ``graded`` is never graded again. A line cut short by a kill is skipped."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path


class AlreadyServing(RuntimeError):
    pass


class Journal:
    def __init__(self, root: Path):
        self.path = Path(root) / "on_submit" / "journal.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one service per course: two would grade the same submission twice
        self._lock = open(self.path.with_name("service.lock"), "a")  # noqa: SIM115
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise AlreadyServing(
                f"another serve-submissions is serving this course ({self.path.parent}"
                "/service.lock is held): one service per course"
            ) from None
        self.entries: dict[str, dict] = {}  # submission key -> its latest line
        self.order: list[str] = []  # keys in the order first written
        self._load()
        self._file = open(self.path, "a")  # noqa: SIM115 (open for the service's life)

    def _load(self) -> None:
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return
        for line in lines:
            try:
                entry = json.loads(line)
                key = entry["submission"]
            except (ValueError, KeyError, TypeError):
                continue  # cut short by a kill
            if key not in self.entries:
                self.order.append(key)
            self.entries[key] = {**self.entries.get(key, {}), **entry}

    def write(self, key: str, state: str, **fields) -> None:
        entry = {"submission": key, "state": state, **fields}
        self._file.write(json.dumps(entry) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if key not in self.entries:
            self.order.append(key)
        self.entries[key] = {**self.entries.get(key, {}), **entry}

    def state(self, key: str) -> str | None:
        entry = self.entries.get(key)
        return entry["state"] if entry else None

    def of(self, student: str, assignment: str) -> list[dict]:
        """The student's submissions of ``assignment`` the journal knows, oldest first."""
        found = [
            self.entries[k]
            for k in self.order
            if self.entries[k].get("student") == student
            and self.entries[k].get("assignment") == assignment
        ]
        return sorted(found, key=lambda e: (e["timestamp"], e["submission"]))

    def close(self) -> None:
        self._file.close()
        self._lock.close()

"""``nbgrader collect`` that takes a submission only from the student it names.

nbgrader's exchange names an inbound submission after the ``--student`` its submitter
gave (``inbound/<student>+<assignment>+<time>+<random>``), whoever that was. Its collect
compares the folder's owner with that name and, when they differ, only warns ("cheating
attempt?"), then collects it: as the named student's, or with ``--update`` in place of
their own. Here a submission counts only for the student who made it: one whose folder
or any file in it is owned by another login is refused (an error line names it and its
real owner), and the named student's own latest submission is collected as if the
other had never been there. Set in the course config (``c.ExchangeFactory.collect``).
Where the exchange cannot tell owners apart (Windows, or a login that is no unix user)
nbgrader's own rule holds, as ``CollectApp.check_owner = False`` turns it off.

A submission's time is when it reached the exchange (``timestamps.arrived``: the latest
change time of its folder and files, which the student cannot set back), never the time
in its folder's name or its ``timestamp.txt``, which the student writes: that time
chooses the latest submission (and, with ``--before-duedate``, the latest before the
due date), and is written into the collected copy's ``timestamp.txt``, from which
``nbgrader autograde`` records the submission's time and its late penalty.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

from nbgrader.exchange.default.collect import ExchangeCollect

try:
    import pwd
except ImportError:  # Windows: no owners to compare
    pwd = None


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def foreign_owners(path: str, student: str) -> set[str]:
    """The logins other than ``student`` that own ``path`` or anything in it."""
    found = set()
    for top, dirs, files in os.walk(path):
        for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
            owner = _owner(os.lstat(name).st_uid)
            if owner != student:
                found.add(owner)
    return found


class OwnedCollect(ExchangeCollect):
    def _path_to_record(self, path):
        from autograder.grading.recording.timestamps import arrived

        record = super()._path_to_record(path)  # the student and the name's time
        record["named"], record["timestamp"] = record["timestamp"], arrived(path)
        return record

    def do_copy(self, src, dest, log=None):
        """The student's files, then ``timestamp.txt`` with the time it arrived."""
        from autograder.grading.recording.timestamps import (
            FORMAT,
            arrived,
            named_time,
            write_time,
        )

        when = arrived(src)
        super().do_copy(src, dest, log)
        write_time(dest, when)
        named = named_time(os.path.basename(src))
        if named is not None and abs((named - when).total_seconds()) > 60:
            self.log.warning(
                "%s: its name says %s; it reached the exchange at %s, the time that "
                "counts (timestamp.txt says so now)",
                src, named.strftime(FORMAT), when.strftime(FORMAT),
            )  # fmt: skip

    def init_src(self):
        super().init_src()  # nbgrader's paths, due date and choice of records
        if not self.check_owner or pwd is None or sys.platform == "win32":
            return
        pattern = f"{self.coursedir.student_id or '*'}+{self.coursedir.assignment_id}+*"
        import glob

        own, refused = defaultdict(list), 0
        for path in glob.glob(os.path.join(self.inbound_path, pattern)):
            record = self._path_to_record(path)
            others = foreign_owners(path, record["username"])
            if others:
                refused += 1
                self.log.error(
                    "REFUSED %s: it names %s but is owned by %s; not collected (a "
                    "submission counts only for the student who made it). %s's own "
                    "submission, if any, is collected instead; delete this one from "
                    "the exchange once you have dealt with it.",
                    path, record["username"], ", ".join(sorted(others)),
                    record["username"],
                )  # fmt: skip
            else:
                own[record["username"]].append(record)
        if not refused:
            return
        # nbgrader's choice again, among each student's own submissions: the latest, or
        # with --before-duedate the latest before the due date (else the latest)
        chosen = []
        for records in own.values():
            records = self._sort_by_timestamp(records)
            if self.duedate is not None and self.before_duedate:
                early = [r for r in records if r["timestamp"] <= self.duedate]
                records = early or records
            chosen.append(records[0])
        self.src_records = chosen

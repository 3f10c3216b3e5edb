"""The loop of ``python -m autograder serve-submissions``: every second, each waiting
submission of an assignment graded on submit, oldest first, is refused (another login's
files), kept until the due date, or graded; graded ones are recorded through the
course's own path (``autograde.record``: nbgrader autograde with the verdicts, then
``generate_feedback``) and their page written to the exchange. ``--once``: what is
waiting, then exit. Without it, the course's settings are read again every
``RELOAD_SECONDS`` (an assignment switched on needs no restart).

One warm sandbox grades for the service's life, ``jobs`` notebooks at a time, each
student's attempts one after another (the next is taken up once the last is recorded),
so a notebook that loops or eats memory holds one worker until its own time limit and
no one else's. A student's attempt is recorded as soon as it is graded, with whatever
else finished meanwhile (one ``record`` for all of them)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from autograder.on_submit import attempts, pages, settings
from autograder.on_submit.inbound import (
    Submission,
    inbound_path,
    others_owning,
    waiting,
)
from autograder.on_submit.journal import Journal

POLL_SECONDS = 1.0
RELOAD_SECONDS = 10.0  # the course's settings read again this often


def exchange_of(root: Path, exchange: Path | None) -> tuple[Path, str]:
    """The exchange root (``exchange``, else the course config's ``Exchange.root``,
    else nbgrader's default) and the course id, as ``nbgrader submit`` uses them."""
    from autograder.grading.nbgrader_bridge import COURSE_ID, course_config

    config = course_config(root)
    if exchange is None:
        exchange = Path(
            config.get("Exchange", {}).get("root", "/srv/nbgrader/exchange")
        )
    course_id = config.get("CourseDirectory", {}).get("course_id") or COURSE_ID
    return Path(exchange), course_id


LOG_FILE: Path | None = None  # the service's own log (``on_submit/service.log``)


def log(message: str) -> None:
    """A line to stderr (the hub's log, systemd's journal, the terminal) and to the
    service's log file in the course root, which the instructor can read anywhere."""
    line = f"[on-submit] {message}"
    print(line, file=sys.stderr, flush=True)
    if LOG_FILE is not None:
        try:
            with open(LOG_FILE, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
        except OSError:
            pass


def log_files(root: Path) -> tuple[Path, Path]:
    """The service's log and the file with its process id, in the course root."""
    folder = Path(root) / "on_submit"
    return folder / "service.log", folder / "service.pid"


class Service:
    def __init__(
        self, root: Path, exchange: Path, course_id: str, jobs: int, limits,
        strict: bool = True,
    ):  # fmt: skip
        """``strict``: a mistake in the settings is raised (``--once``); else it is
        logged and nothing is graded until it is fixed (a service the hub or systemd
        restarts must not exit over it: it would be started again and again)."""
        self.root, self.exchange, self.course_id = Path(root), Path(exchange), course_id
        self.jobs, self.limits = max(1, jobs), limits
        self.check_owner = settings.check_owner(self.root)
        self.inbound = inbound_path(self.exchange, course_id)
        self.work = self.root / "on_submit" / "attempts"  # each graded attempt's copy
        self.journal = Journal(self.root)  # refuses a second service
        global LOG_FILE
        LOG_FILE, self.pid_file = log_files(self.root)
        try:
            self.policies = settings.load(self.root)
        except settings.SettingsError as exc:
            if strict:
                self.journal.close()
                raise
            self.policies = {}
            self._complain(
                f"{exc}; nothing is graded on submit until it is fixed (the settings "
                "are read again every 10 s)"
            )
        self.pid_file.write_text(f"{os.getpid()}\n")
        self.busy: dict[
            tuple[str, str], Future
        ] = {}  # (student, assignment) -> grading
        self.pending: dict[tuple[str, str], Submission] = {}

    # --- the loop -------------------------------------------------------------------

    def run(self, once: bool = False) -> int:
        """The loop; its process id in ``on_submit/service.pid`` while it runs (``kill
        $(cat ...)`` stops it: the hub, or systemd, starts it again)."""
        try:
            return self._run(once)
        finally:
            try:
                if self.pid_file.read_text().strip() == str(os.getpid()):
                    self.pid_file.unlink()
            except OSError:
                pass
            log("stopped")

    def _run(self, once: bool) -> int:
        from autograder.grading.grade import _in_a_thread
        from autograder.grading.running.preflight import prove
        from autograder.grading.running.sandbox import Sandbox

        log(f"started (process {os.getpid()})")
        if once and not self.policies:
            log("no assignment is graded on submit (c.GradeOnSubmit.assignments)")
            return 0
        if self.prepare(self.policies) != 0:
            return 1
        self.work.mkdir(parents=True, exist_ok=True)
        self.feedback_folder()
        hide = [self.work, self.exchange, self.root]
        with (
            Sandbox(self.limits, hide=hide) as sandbox,
            ThreadPoolExecutor(self.jobs) as pool,
        ):
            _in_a_thread(prove, sandbox, self.limits)
            self.sandbox, self.pool = sandbox, pool
            self.announce()
            looked = time.monotonic()
            while True:
                if not once and time.monotonic() - looked >= RELOAD_SECONDS:
                    self.reload()  # switched on or changed without a restart
                    self.feedback_folder()
                    looked = time.monotonic()
                taken = self.take_up()
                recorded = self.record_finished()
                if once and not taken and not recorded and not self.busy:
                    return 0
                if not recorded:
                    time.sleep(POLL_SECONDS)

    def feedback_folder(self) -> None:
        """The exchange's feedback folder, for a course released before
        ``release_assignment`` made it: a student's *Fetch Feedback* before their first
        page then finds nothing, plainly, instead of failing with a traceback."""
        from autograder.grading.recording import feedback_folder

        try:
            feedback_folder.ensure(self.exchange, self.course_id)
        except OSError as exc:
            self._complain(f"could not make the exchange's feedback folder ({exc})")

    def announce(self) -> None:
        on = ", ".join(self.policies) or "none yet (c.GradeOnSubmit.assignments)"
        log(f"grading on submit: {on}; watching {self.inbound}")

    def prepare(self, assignments) -> int:
        """Each assignment's reference loaded (here, before a worker imports it) and
        the assignment in the gradebook."""
        from autograder.grading.grade import load_chapter_tests
        from autograder.grading.recording import autograde as ag

        for assignment in assignments:
            load_chapter_tests(assignment).reference()
            if ag.enter_assignment(self.root, assignment) != 0:
                log(f"could not enter {assignment} in the gradebook")
                return 1
        return 0

    def reload(self) -> None:
        """The course's settings again: a mistake in them is logged and the last good
        ones kept."""
        try:
            policies = settings.load(self.root)
        except settings.SettingsError as exc:
            self._complain(f"{exc}; keeping the settings read before")
            return
        except Exception as exc:  # noqa: BLE001 (a half-edited config file)
            self._complain(
                f"could not read nbgrader_config.py ({exc!r:.200}); keeping the last"
            )
            return
        self._complained = None
        if policies == self.policies:
            return
        if self.prepare(set(policies) - set(self.policies)) == 0:
            self.policies = policies
            self.announce()

    _complained: str | None = None

    def _seen(self, key: str):
        """The time the journal keeps for a submission (when it arrived, as first
        seen): a change to its files since cannot move it."""
        entry = self.journal.entries.get(key)
        if entry and entry.get("timestamp"):
            return attempts.parse(entry["timestamp"])
        return None

    def _complain(self, message: str) -> None:
        """A mistake in the settings, logged once (not every ``RELOAD_SECONDS``)."""
        if message != self._complained:
            log(message)
            self._complained = message

    def take_up(self) -> int:
        """Each student's oldest waiting submission that is not done with, unless one
        of theirs is being graded: refused, held or sent to a worker."""
        taken = 0
        seen = set()
        for sub in waiting(self.inbound, self.policies, self._seen):
            who = (sub.student, sub.assignment)
            state = self.journal.state(sub.key)
            done_with = ("graded", "refused", "fault")
            if state in done_with or who in seen or who in self.busy:
                continue
            policy = self.policies[sub.assignment]
            due = settings.due_date(self.root, sub.assignment, policy)
            now = settings.now()
            if state == "held" and (due is None or now < due):
                continue  # kept until the due date
            seen.add(who)
            if state is None and self.check_owner and (others := others_owning(sub)):
                self.refuse(sub, others)
                taken += 1
                continue
            entry = self.journal.entries.get(sub.key, {})
            number = entry.get("attempt")
            if number is None:  # a crash before its verdict keeps the number given
                history = [
                    e for e in self.journal.of(*who) if e["submission"] != sub.key
                ]
                decision = attempts.decide(history, sub.timestamp, policy, due, now)
                if not decision.grade:
                    self.hold(sub, decision.why_held)
                    taken += 1
                    continue
                number = decision.number
            self.start(sub, number, entry)
            taken += 1
        return taken

    def _fields(self, sub: Submission) -> dict:
        return {
            "student": sub.student,
            "assignment": sub.assignment,
            "timestamp": sub.timestamp.strftime(attempts.TIME),
        }

    def refuse(self, sub: Submission, others: set[str]) -> None:
        log(
            f"REFUSED {sub.folder}: it names {sub.student} but is owned by "
            f"{', '.join(sorted(others))}; not graded (a submission counts only for the "
            f"student who made it). {sub.student}'s own submissions are graded as usual; "
            "delete this one from the exchange once you have dealt with it."
        )
        self.journal.write(
            sub.key, "refused", owners=sorted(others), **self._fields(sub)
        )

    def hold(self, sub: Submission, why: str) -> None:
        policy = self.policies[sub.assignment]
        used = len([e for e in self.journal.of(sub.student, sub.assignment)
                    if e.get("attempt")])  # fmt: skip
        text = (
            f"Submission of {sub.timestamp:%Y-%m-%d %H:%M:%S} UTC received and kept, not "
            f"graded now: {why}. {attempts.left(policy, used)}."
        )
        pages.write(pages.feedback_path(self.exchange, self.course_id, sub),
                    pages.held_page(sub, text))  # fmt: skip
        self.journal.write(sub.key, "held", **self._fields(sub))
        log(f"kept {sub.key} until the due date: {why}")

    def start(self, sub: Submission, number: int, entry: dict) -> None:
        """Copy the attempt where the jail cannot see it from a kernel, then grade it
        (or, when a crash came after its verdict, go straight to recording it)."""
        from autograder.grading.recording.timestamps import write_time

        copy = self.work / sub.key
        copy.mkdir(parents=True, exist_ok=True)
        name = f"{sub.assignment}.ipynb"
        if (sub.folder / name).is_file():
            shutil.copy(sub.folder / name, copy / name)
        # the time it arrived, never the student's timestamp.txt: nbgrader's late
        # penalty reads this one
        write_time(copy, sub.timestamp)
        who = (sub.student, sub.assignment)
        self.pending[who] = sub
        if entry.get("state") == "verdict":
            done: Future = Future()
            done.set_result(entry["result"])
            self.busy[who] = done
            return
        self.journal.write(sub.key, "started", attempt=number, **self._fields(sub))
        self.busy[who] = self.pool.submit(
            self.grade, sub, copy / f"{sub.assignment}.ipynb"
        )

    def grade(self, sub: Submission, notebook: Path) -> dict:
        from autograder.grading.grade import grade_notebook
        from autograder.grading.recording.autograde import _annotate

        result = grade_notebook(
            notebook, sub.assignment, None, self.limits, self.sandbox
        )
        _annotate(result, sub.student, notebook, sub.assignment, self.limits)
        self.journal.write(sub.key, "verdict", result=result)
        return result

    # --- recording ------------------------------------------------------------------

    def record_finished(self) -> int:
        """Record every attempt graded since the last look, one ``record`` per
        assignment, then write their pages; returns how many."""
        done = {who: f for who, f in self.busy.items() if f.done()}
        if not done:
            return 0
        by_assignment: dict[str, list] = {}
        for who, future in done.items():
            sub = self.pending[who]
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 (a grader bug: tried again next look)
                log(f"grading {sub.key} failed ({exc!r:.200}); it will be tried again")
                del self.busy[who], self.pending[who]
                continue
            by_assignment.setdefault(sub.assignment, []).append((sub, result))
        for assignment, graded in by_assignment.items():
            self.record(assignment, graded)
        for who in done:
            self.busy.pop(who, None)
            self.pending.pop(who, None)
        return len(done)

    def _place(self, sub: Submission) -> None:
        """The attempt as nbgrader's collect would leave it in ``submitted/``."""
        folder = self.root / "submitted" / sub.student / sub.assignment
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            if old.is_file():
                old.unlink()
        copy = self.work / sub.key
        for item in copy.iterdir():
            shutil.copy(item, folder / item.name)

    def _attempt(self, sub: Submission, result: dict, why: str) -> dict:
        entry = self.journal.entries[sub.key]
        return {
            "number": entry["attempt"],
            "timestamp": entry["timestamp"],
            "sha256": result.get("submission_sha256"),
            "why": why,
        }

    def record(self, assignment: str, graded: list[tuple[Submission, dict]]) -> None:
        from autograder.grading.recording import autograde as ag

        policy = self.policies[assignment]
        for sub, result in graded:
            self._place(sub)
            result["attempt"] = self._attempt(sub, result, "the latest graded attempt")
        results = [r for _, r in graded]
        status = ag.record(self.root, assignment, results, force=True,
                           jobs=self.jobs, feedback=True)  # fmt: skip
        if status != 0:
            log(f"recording {assignment} exited with {status}; see its log above")
        keep_again = []
        for sub, result in graded:
            made = (
                self.root / "feedback" / sub.student / assignment / f"{assignment}.html"
            )
            entry = self.journal.entries[sub.key]
            used = entry["attempt"]
            if not result.get("graded", True):
                self._not_counted(sub, result, policy, used)
                continue
            text = (
                f"Attempt {used} (submitted {sub.timestamp:%Y-%m-%d %H:%M:%S} UTC): "
                f"{attempts.left(policy, used)}."
            )
            if made.is_file():
                page = pages.with_banner(made.read_text(), text)
            else:
                why = result.get("message") or "it could not be graded"
                title = f"{assignment}: attempt {used} not graded"
                page = pages.held_page(sub, f"{text} Not graded: {why}", title)
            pages.write(pages.feedback_path(self.exchange, self.course_id, sub), page)
            self.journal.write(
                sub.key, "graded", score=result["score"],
                max_score=result["max_score"], sha256=result.get("submission_sha256"),
            )  # fmt: skip
            log(
                f"graded {sub.key}: attempt {used}, {result['score']:g} of "
                f"{result['max_score']:g}"
            )
            keep_again.append(self._keep(sub, policy))
        again = [k for k in keep_again if k is not None]
        if again:  # the gradebook holds the attempt the instructor chose
            for sub, _ in again:
                self._place(sub)
            ag.record(self.root, assignment, [r for _, r in again], force=True,
                      jobs=self.jobs)  # fmt: skip

    def _not_counted(self, sub: Submission, result: dict, policy, number: int) -> None:
        """A grader fault (``graded: False``) is never the student's grade: the page says
        so, the attempt does not count against the limit, and the instructor's own
        autograde grades the submission later."""
        why = result.get("message") or "a fault of the grader's"
        text = (
            f"Submission of {sub.timestamp:%Y-%m-%d %H:%M:%S} UTC: not graded. The grader "
            f"could not grade it ({why}). That is the grader's fault, not your "
            "notebook's: it does not count as a graded attempt "
            f"({attempts.left(policy, number - 1)}), and your instructor will grade it."
        )
        title = f"{sub.assignment}: not graded (the grader's fault)"
        pages.write(pages.feedback_path(self.exchange, self.course_id, sub),
                    pages.held_page(sub, text, title))  # fmt: skip
        self.journal.write(sub.key, "fault", attempt=None, message=why[:300])
        log(f"NOT GRADED {sub.key} (a grader fault, not counted as an attempt): {why}")

    def _keep(self, sub: Submission, policy) -> tuple[Submission, dict] | None:
        """The student's chosen attempt when it is not the one just recorded (which
        then becomes the gradebook's again), with its provenance; else None (the one
        just recorded is chosen: its provenance says why)."""
        from autograder.grading.recording.provenance import record_in_gradebook

        history = self.journal.of(sub.student, sub.assignment)
        pick, why = attempts.chosen(history, policy.keep)
        result = self.journal.entries[pick["submission"]]["result"]
        result["attempt"] = {**(result.get("attempt") or {}), **{
            "number": pick["attempt"], "timestamp": pick["timestamp"],
            "sha256": result.get("submission_sha256"), "why": why,
        }}  # fmt: skip
        if pick["submission"] == sub.key:
            db = f"sqlite:///{self.root / 'gradebook.db'}"
            record_in_gradebook(db, sub.assignment, sub.student, result)
            return None
        folder = pick["submission"]
        chosen = Submission(self.work / folder, sub.student, sub.assignment,
                            sub.timestamp)  # fmt: skip
        return chosen, result

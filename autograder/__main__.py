"""Command line: ``python -m autograder build [--check]``, ``book``, ``grade ...``,
``edition OUT_DIR`` (the student edition of a course taught for credit), ``autograde
ASSIGNMENT`` (a class into nbgrader's gradebook, in parallel), ``merge``
(shards' results into the gradebook), ``check`` (is this machine ready to grade?) and
``release`` (version, digests and the change log's freshness; ``--record`` at a release),
``report [ASSIGNMENT]`` (the class report: what the class got wrong) and ``export --lms
canvas|moodle|blackboard`` (the gradebook as an LMS's grade-import CSV) and
``serve-submissions`` (grading on submit: ``autograder/on_submit/``)."""

import argparse
import json
import sys
import time
from pathlib import Path

from autograder import paths


def _build(args) -> int:
    from autograder.build import build, stale_files

    if args.check:
        stale = stale_files()
        for path in stale:
            print(
                f"stale: {path} (run `python -m autograder build` and commit the result)"
            )
        return 1 if stale else 0
    for path in build(chapters=args.chapter or None):
        print(f"wrote {path}")
    return 0


def _book(args) -> int:
    import subprocess

    from autograder.build import build
    from autograder.build.book import book_command, book_env

    build()
    return subprocess.run(book_command(rebuild_all=args.all), env=book_env()).returncode


def _edition(args) -> int:
    from autograder.build import build, edition

    try:
        # refuse a wrong chapter before any work; then the student notebooks, fresh (the
        # edition's are the ones you grade)
        edition.released_modules(args.with_solutions)
        edition.addresses()
        build()
        out = edition.make(args.out_dir, args.with_solutions)
    except edition.EditionError as exc:
        print(exc, file=sys.stderr)
        return 2
    where = edition.addresses()
    print(
        f"wrote the student edition in {out}: push it to {where['edition']} "
        f"(branch {where['edition_branch']}); its book is published at "
        f"{where['edition_book']}"
    )
    return 0


def _limits(args):
    from autograder.grading.running.limits import Limits

    return Limits(
        cell=args.cell_timeout,
        notebook=args.timeout,
        test=args.test_timeout,
        startup=args.startup_timeout,
        memory_mb=args.memory_mb,
        output_mb=args.output_mb,
        processes=args.processes,
        threads=args.threads,
        kernel_uid=args.kernel_uid,
        hide=[str(p) for p in args.hide],
    )


def _grade(args) -> int:
    from autograder.grading.grade import STOPPED, grade_many
    from autograder.grading.judging.spec import graded_chapters
    from autograder.grading.running.sandbox import SandboxUnavailable

    if args.assignment is not None and args.assignment not in graded_chapters():
        print(
            f"unknown assignment {args.assignment!r}; known: {', '.join(graded_chapters())}",
            file=sys.stderr,
        )
        return 2
    ungraded = stopped = 0
    try:
        for result in grade_many(
            args.notebooks,
            args.assignment,
            args.jobs,
            args.seed,
            _limits(args),
            sandboxed=not args.no_sandbox,
        ):
            _report(result, args.json)
            ungraded += not result["graded"]
            stopped += STOPPED in result["message"]
    except SandboxUnavailable as exc:
        print(
            f"{exc}\n(--no-sandbox runs student code unjailed: trusted code only)",
            file=sys.stderr,
        )
        return 3
    if ungraded:
        print(
            f"{ungraded} notebook(s) not graded because of a grader fault (see their "
            "messages); their results are no grades",
            file=sys.stderr,
        )
    return 3 if stopped else 4 if ungraded else 0


def _autograde(args) -> int:
    from autograder.grading.judging.spec import graded_chapters
    from autograder.grading.recording import autograde as ag

    if args.assignment not in graded_chapters():
        print(f"unknown assignment {args.assignment!r}", file=sys.stderr)
        return 2
    root = ag.course_root(args.course_dir)
    shard = None
    if args.shard:
        try:
            k, n = map(int, args.shard.split("/"))
            assert 1 <= k <= n
        except (ValueError, AssertionError):
            print("--shard takes K/N with 1 <= K <= N, e.g. 2/8", file=sys.stderr)
            return 2
        shard = (k, n)
    if _stamp(args, root) != 0:
        return 2
    run = _ClassRun(args, root, shard)
    with ag.stop_on_signals():
        try:
            return run.run()
        except KeyboardInterrupt as stop:  # SIGINT or SIGTERM (ag.Stopped)
            name, status = ag.stopped_by(stop)
            run.stopped(name)
            return status


def _stamp(args, root) -> int:
    """``--timestamps``: hand-placed submissions' times, written before anything is
    graded; and a word on those that carry none where a due date makes it matter."""
    from autograder.grading.recording import autograde as ag
    from autograder.grading.recording import timestamps

    if args.timestamps:
        try:
            lines = timestamps.stamp(
                root, args.assignment, timestamps.read(args.timestamps)
            )
        except (timestamps.StampError, OSError) as exc:
            print(f"[autograder] {exc}", file=sys.stderr)
            return 2
        for line in lines:
            print(f"[autograder] time of {line}", file=sys.stderr)
    everyone = list(ag.submissions(root, args.assignment, args.student, True))
    missing, due = timestamps.unstamped(root, args.assignment, everyone)
    if missing:
        print(
            f"[autograder] {len(missing)} submission(s) carry no time (no timestamp.txt: "
            f"placed by hand?), so nbgrader records them as on time although "
            f"{args.assignment} is due {due}: {', '.join(missing[:10])}"
            + (" ..." if len(missing) > 10 else "")
            + "; give their times with --timestamps FILE (the instructor guide says how)",
            file=sys.stderr,
        )
    return 0


class _ClassRun:
    """``autograde``: what is left to grade and record, graded (each verdict kept in the
    journal as it comes), then recorded; on a stop, says what was kept and what is left."""

    def __init__(self, args, root, shard):
        self.args, self.root, self.shard = args, root, shard
        self.journal, self.kept, self.notebooks, self.results = None, {}, {}, None
        self.pages, self.entering = [], None

    def run(self) -> int:
        from autograder.grading.recording import autograde as ag
        from autograder.grading.running.sandbox import SandboxUnavailable

        args, root, shard = self.args, self.root, self.shard
        entering = None
        if shard is None:  # on the other core while the grader starts; needed to record
            entering = self.entering = ag.Entering(root, args.assignment)
        limits = _limits(args)
        if shard is None:
            self.journal = ag.Journal(ag.journal_path(root, args.assignment))
            everyone = ag.submissions(root, args.assignment, args.student, True)
            kept = self.journal.kept(everyone, args.assignment, args.seed, limits)
            to_record, already, self.pages = ag.plan(
                root, args.assignment, args.student, args.force, args.feedback, kept
            )
            self.kept = {s: r for s, r in kept.items() if s in to_record}
            head = ag.progress_line(already, self.pages) + ", "
            # the journal goes on with every verdict that still holds, those recorded
            # included (their page may be left to write)
            carried = list(kept.values())
        else:
            to_record = {
                s: p
                for s, p in ag.submissions(
                    root, args.assignment, args.student, args.force
                ).items()
                if ag.in_shard(s, *shard)
            }
            self.journal = ag.Journal(_partial(self._results_path()))
            self.kept = self.journal.kept(to_record, args.assignment, args.seed, limits)
            head, carried = "", list(self.kept.values())
        self.notebooks = {s: p for s, p in to_record.items() if s not in self.kept}
        kept = f"{len(self.kept)} graded before a stop (kept), " if self.kept else ""
        print(
            f"[autograder] {args.assignment}: {head}{kept}{len(self.notebooks)} to grade "
            f"with {args.jobs} job(s)"
            + (f", shard {shard[0]} of {shard[1]}" if shard else ""),
            file=sys.stderr,
        )
        self.journal.start(carried)
        started, timings = time.perf_counter(), {}
        ahead = None
        if shard is None:  # recorded while graded, in the time the grading leaves idle
            ahead = ag.RecordingAhead(
                root, args.assignment, [*self.notebooks, *self.kept], args.feedback,
                entering,
            )  # fmt: skip
            for result in self.kept.values():
                ahead.add(result)
        try:
            graded_now = ag.grade_class(
                self.notebooks, args.assignment, args.jobs, args.seed, limits,
                timings=timings, journal=self.journal,
                on_graded=ahead.add if ahead else None,
            )  # fmt: skip
        except SandboxUnavailable as exc:
            print(f"{exc}", file=sys.stderr)
            if entering is not None:
                entering.result()
            if ahead is not None:
                ahead.close()
            return 3
        except BaseException:
            if ahead is not None:
                ahead.stop()
            raise
        finally:
            self.journal.close()
        results = self.results = list(self.kept.values()) + graded_now
        if shard is not None:
            ag.write_results(results, self._results_path())
            self.journal.discard()
            print(
                f"[autograder] results written to {self._results_path()}",
                file=sys.stderr,
            )
        elif args.results:
            ag.write_results(results, args.results)
            print(f"[autograder] results written to {args.results}", file=sys.stderr)
        graded = time.perf_counter()
        status, previous, scores = 0, None, None
        if shard is None:
            if entering.result() != 0:
                print(
                    f"[autograder] could not enter {args.assignment} in the gradebook "
                    "(nbgrader's log above says why): nothing recorded",
                    file=sys.stderr,
                )
                ahead.close()
                return 1
            try:
                previous, status = self._record_the_rest(ahead, results, timings)
            except BaseException:  # a stop: the worker recording ahead ends too
                ahead.stop()
                raise
            self.journal.discard()  # completed: every verdict is in the gradebook
            scores = ag.recorded_scores(root, args.assignment)
        recorded = time.perf_counter()
        print(ag.summary(results, previous=previous, recorded=scores))
        if shard is None:
            _report_not_autograded(root, args.assignment, results)
        print(ag.time_line(graded - started, recorded - graded, timings, results))
        if status:
            return 1
        return 4 if any(not r["graded"] for r in results) else 0

    def _record_the_rest(self, ahead, results: list[dict], timings: dict):
        """Once the recording beside the grading (``ahead``) has ended, every student it
        did not record, on every worker; the gradebook's grades from before this run,
        and the largest exit status of nbgrader's."""
        from autograder.grading.recording import autograde as ag

        args = self.args
        taking = ahead.finish()
        previous = ahead.previous  # read before it recorded anyone
        if previous is None:  # it recorded no one
            ahead.close()
            previous = ag.previous_provenance(self.root, args.assignment)
        left = [r for r in results if r["student"] not in ahead.recorded | taking]
        # beside the recording it has under way, which keeps a core: at its lower
        # priority it would otherwise wait for these workers, then run alone
        workers = args.jobs - 1 if taking and args.jobs > 1 else args.jobs
        status = ag.record(
            self.root, args.assignment, left, True, workers, args.feedback,
            timings, pages=self.pages,
        )  # fmt: skip
        ahead.close()
        again = [r for r in results if r["student"] in taking - ahead.recorded]
        if again:  # its worker was killed: nbgrader records them again (--force)
            status = max(status, ag.record(
                self.root, args.assignment, again, True, args.jobs, args.feedback,
                timings,
            ))  # fmt: skip
        ahead.tidy()
        for name in ("autograde", "generate_feedback"):
            if name in ahead.timings:
                timings[name] = timings.get(name, 0.0) + ahead.timings[name]
        if ahead.recorded:
            timings["ahead"] = len(ahead.recorded)
            timings.setdefault("workers", 1)
        return previous, max(status, ahead.status)

    def _results_path(self):
        args, shard = self.args, self.shard
        return args.results or (
            self.root
            / "shards"
            / f"{args.assignment}.shard-{shard[0]}-of-{shard[1]}.jsonl"
        )

    def stopped(self, stop) -> None:
        """A stop (SIGINT or SIGTERM; the handlers are back to the default, so a second
        one ends the process at once): every verdict finished and not yet in the
        gradebook is recorded there now, as the rerun would record it (its completion
        mark is the one the rerun checks), then what was recorded and what is left is
        said. A shard keeps its verdicts for its own rerun (it records nothing)."""
        from autograder.grading.recording import autograde as ag

        kept = self.journal.load() if self.journal else {}
        kept = {s: r for s, r in kept.items() if r.get("graded")}
        this_run = set(self.notebooks) | set(self.kept)
        left = len(this_run - set(kept))
        where = self.journal.path if self.journal else None
        again = "run the same command again to go on"
        if self.shard is not None or self.entering is None:
            print(
                f"[autograder] stopped by {stop}: {len(kept)} verdict(s) kept in "
                f"{where}, {left} submission(s) left to grade; {again} (it grades "
                "only those left)",
                file=sys.stderr,
            )
            return
        phase = " while recording" if self.results is not None else ""
        args = self.args
        # only verdicts that still hold (same file, digest, version, limits, seed)
        everyone = ag.submissions(self.root, args.assignment, None, True)
        kept = self.journal.kept(everyone, args.assignment, args.seed, _limits(args))
        left = len(this_run - set(kept))
        todo, done, pages = ag.recorded_already(
            self.root, args.assignment, list(kept.values()), args.feedback
        )
        status = 0
        # stopped while grading: record what was finished. Stopped while recording, the
        # signal reached the recording's own nbgrader processes too (a half-written
        # feedback page): what is left is recorded by the rerun, which checks each mark
        if (todo or pages) and self.results is None:
            print(
                f"[autograder] stopped by {stop}{phase}: recording the {len(todo)} "
                f"verdict(s) finished and not yet in the gradebook ({stop} again to "
                "leave them for the rerun: they are kept)",
                file=sys.stderr,
            )
            if self.entering.result() != 0:
                status = 1
            else:
                # the whole run's students in id order, as one run would enter them
                ag._enter_students(self.root, sorted(this_run | set(kept)))
                status = ag.record(
                    self.root, args.assignment, todo, True, args.jobs, args.feedback,
                    pages=pages,
                )  # fmt: skip
        _, recorded, _ = ag.recorded_already(
            self.root, args.assignment, list(kept.values()), args.feedback
        )
        now = len(set(recorded) - set(done))
        failed = (
            f" (nbgrader exited with {status}: its log above says why)"
            if status
            else ""
        )
        print(
            f"[autograder] stopped by {stop}{phase}: {len(kept)} verdict(s) finished "
            f"(kept in {where}), {len(recorded)} recorded in the gradebook ({now} of "
            f"them now{failed}): formgrader and export show them; "
            f"{len(kept) - len(recorded)} left to record, {left} submission(s) left to "
            f"grade; {again} (it grades only those left)",
            file=sys.stderr,
        )


def _partial(path):
    """Where a shard keeps its results while it runs: its results file is written
    whole, at the end, so ``merge`` never reads a stopped shard's."""
    return path.with_name(path.name + ".partial")


def _report_not_autograded(root, assignment: str, results: list[dict]) -> None:
    from autograder.grading.recording.autograde import not_autograded

    for student in not_autograded(root, assignment, results):
        print(
            f"NOT AUTOGRADED {student}: nbgrader could not process this submission "
            "(no autograded copy; its log above says why)"
        )


def _merge(args) -> int:
    from autograder.grading.recording import autograde as ag

    root = ag.course_root(args.course_dir)
    results = [
        r for r in ag.read_results(args.results) if r["assignment"] == args.assignment
    ]
    with ag.stop_on_signals():
        try:
            if ag.enter_assignment(root, args.assignment) != 0:
                return 1
            previous = ag.previous_provenance(root, args.assignment)
            left, already, pages = ag.recorded_already(
                root, args.assignment, results, args.feedback
            )
            print(
                f"[autograder] {args.assignment}: {ag.progress_line(already, pages)}, "
                f"{len(left)} to record",
                file=sys.stderr,
            )
            status = ag.record(
                root, args.assignment, left, True, args.jobs, args.feedback,
                pages=pages,
            )  # fmt: skip
        except KeyboardInterrupt as stop:  # SIGINT or SIGTERM (ag.Stopped)
            name, status = ag.stopped_by(stop)
            _, already, _ = ag.recorded_already(
                root, args.assignment, results, args.feedback
            )
            print(
                f"[autograder] merge stopped by {name}: {len(already)} student(s) "
                f"recorded, {len(results) - len(already)} left; run the same merge "
                "again to go on (it records only those left)",
                file=sys.stderr,
            )
            return status
    scores = ag.recorded_scores(root, args.assignment)
    print(ag.summary(results, previous=previous, recorded=scores))
    _report_not_autograded(root, args.assignment, results)
    if status:
        return 1
    return 4 if any(not r["graded"] for r in results) else 0


def _class_report(args) -> int:
    from autograder.grading.judging.spec import graded_chapters
    from autograder.grading.recording import autograde as ag
    from autograder.report import report
    from autograder.report.data import assignments_in

    root = ag.course_root(args.course_dir)
    db = root / "gradebook.db"
    if not db.is_file():
        print(f"no gradebook at {db}: autograde an assignment first", file=sys.stderr)
        return 2
    if args.assignment in (None, "all"):
        assignments, stem = assignments_in(db), "class"
    elif args.assignment in graded_chapters():
        assignments, stem = [args.assignment], args.assignment
    else:
        print(
            f"unknown assignment {args.assignment!r}; known: "
            f"{', '.join(graded_chapters())}, or all",
            file=sys.stderr,
        )
        return 2
    if not assignments:
        print(f"nothing graded yet in {db}", file=sys.stderr)
        return 2
    out = args.out or root / "reports"
    html, table = report(db, assignments, out, stem, args.names, stem == "class")
    print(f"wrote {html}\nwrote {table}")
    return 0


def _export(args) -> int:
    from autograder.grading.recording import autograde as ag
    from autograder.lms import formats, gradebook

    root = ag.course_root(args.course_dir)
    headers = {}
    for pair in args.column:
        assignment, sep, header = pair.partition("=")
        if not sep or not header:
            print(f"--column takes ASSIGNMENT=HEADER, not {pair!r}", file=sys.stderr)
            return 2
        headers[assignment] = header
    stem = args.assignment or "course"
    out = args.out or root / "exports" / f"{args.lms}-{stem}.csv"
    if out.exists() and not args.force:
        print(f"{out} exists: nothing written (--force replaces it)", file=sys.stderr)
        return 2
    try:
        course = gradebook.read(root, args.assignment)
        unknown = sorted(set(headers) - set(course.assignments))
        if unknown:
            raise gradebook.ExportError(
                f"--column names assignment(s) not exported: {', '.join(unknown)}"
            )
        formats.check_match(course, args.lms, args.match)
        text = formats.render(course, args.lms, headers, args.missing, args.match)
    except gradebook.ExportError as exc:
        print(f"{exc}; nothing written", file=sys.stderr)
        return 2
    for line in formats.notes(course, args.missing):
        print(line)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(
        f"wrote {out}: {len(course.students)} student(s), "
        f"{len(course.assignments)} assignment(s), for {args.lms}'s grade import "
        "(student data: keep it out of git)"
    )
    return 0


def _release(args) -> int:
    from autograder import release
    from autograder.grading.recording.provenance import digest_files
    from autograder.paths import REPO, course_version

    if args.record:
        path = release.record()
        print(f"wrote {path.relative_to(REPO)} (release {course_version()})")
        return 0
    last = release.read_record()
    print(
        f"course version {course_version()}; last release recorded: {last.get('version')}"
    )
    for chapter, digest in release.current_digests().items():
        same = digest == last.get("digests", {}).get(chapter)
        print(
            f"  {chapter}: digest {digest[:12]}{'' if same else ' (changed since the release)'}"
        )
        if args.files:
            for path in digest_files(chapter):
                print(f"      {path}")
    problems = release.problems()
    for problem in problems:
        print(f"PROBLEM {problem}")
    return 1 if problems else 0


def _check(args) -> int:
    from autograder.grading.check import check

    return check(_limits(args))


def _report(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result), flush=True)
        return
    from autograder.grading.recording.provenance import short

    print(
        f"{result['notebook']}: {result['score']:g} / {result['max_score']:g} "
        f"({result['assignment']}; course version {result.get('course_version')}, "
        f"digest {short(result.get('digest'))})"
    )
    if not result["graded"]:
        print(f"  NOT GRADED: {result['message']}")
    elif result["message"]:
        print(f"  note: {result['message']}")
    for test in result["tests"]:
        mark = "PASS" if test["passed"] else "FAIL"
        print(
            f"  {mark} {test['id']} {test['score']:g}/{test['max_score']:g}: {test['message']}"
        )
        if test.get("remark"):  # on a line of its own: it took no point
            print(f"       {test['remark']}")


def _serve_submissions(args) -> int:
    from autograder.grading.recording import autograde as ag
    from autograder.on_submit import settings
    from autograder.on_submit.journal import AlreadyServing
    from autograder.on_submit.service import Service, exchange_of

    root = ag.course_root(args.course_dir)
    waited = False
    while True:
        try:
            exchange, course_id = exchange_of(root, args.exchange)
            service = Service(
                root, exchange, course_id, args.jobs, _limits(args), strict=args.once
            )
            break
        except settings.SettingsError as exc:
            print(f"[on-submit] {exc}", file=sys.stderr)
            return 2
        except AlreadyServing as exc:
            # a service that the hub or systemd starts again must not exit over it:
            # it would be started again and again
            if args.once:
                print(f"[on-submit] {exc}", file=sys.stderr)
                return 2
            if not waited:
                print(f"[on-submit] {exc}; waiting for it to stop", file=sys.stderr)
                waited = True
            try:
                time.sleep(10)
            except KeyboardInterrupt:
                return 130
    with ag.stop_on_signals():
        try:
            return service.run(once=args.once)
        except KeyboardInterrupt as stop:  # a graded attempt not recorded: graded again
            return ag.stopped_by(stop)[1]


def _limit_arguments(command) -> None:
    """The limits' flags; their defaults come from ``Limits``, the one place they are set."""
    from autograder.grading.running.limits import Limits

    d = Limits()
    for flag, name, kind, text in (
        ("--cell-timeout", "cell", float, "seconds per student cell"),
        ("--timeout", "notebook", float, "seconds for all student cells"),
        ("--test-timeout", "test", float, "seconds per hidden test"),
        ("--startup-timeout", "startup", float, "seconds to start a kernel, and for it to "
         "start its hidden tests' process"),
        ("--memory-mb", "memory_mb", int, "memory of a submission's processes together, "
         "and address space of each, in MB"),
        ("--output-mb", "output_mb", float, "output a cell may print before it is interrupted"),
        ("--processes", "processes", int, "processes and threads per submission"),
        ("--threads", "threads", int, "PyTorch threads per kernel (keep jobs x threads <= cores)"),
        ("--kernel-uid", "kernel_uid", int, "when run as root: the first of the "
         "unprivileged uids kernels run as"),
    ):  # fmt: skip
        default = getattr(d, name)
        command.add_argument(
            flag, type=kind, default=default, help=f"{text} (default {default:g})"
        )
    command.add_argument(
        "--hide",
        type=Path,
        action="append",
        default=[],
        help="a path to keep out of the sandbox even if it lies under a system folder",
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build", help="derive the nbgrader source and student notebooks"
    )
    build.add_argument(
        "--check",
        action="store_true",
        help="only report committed notebooks that are stale",
    )
    build.add_argument(
        "--chapter",
        action="append",
        help="build only this chapter (repeatable; default: every graded chapter)",
    )
    build.set_defaults(run=_build)
    book = commands.add_parser(
        "book", help="build the notebooks, then the book (executing every chapter)"
    )
    book.add_argument(
        "--all", action="store_true", help="rebuild every page, not only changed ones"
    )
    book.set_defaults(run=_book)
    edition = commands.add_parser(
        "edition",
        help="write the student edition (notebooks, built book, no answers) into a folder "
        "that becomes its own public repository (edition.url in _config.yml)",
    )
    edition.add_argument(
        "out_dir",
        type=Path,
        help="a new or empty folder, or a clone of the edition's repository",
    )
    edition.add_argument(
        "--with-solutions",
        nargs="+",
        default=[],
        metavar="CHAPTER",
        help="also release these chapters' worked solutions, e.g. 03_self_attention "
        "(name every chapter released so far)",
    )
    edition.set_defaults(run=_edition)
    grade = commands.add_parser("grade", help="grade student notebooks")
    grade.add_argument("notebooks", nargs="+", type=Path)
    grade.add_argument(
        "--assignment",
        help="chapter id, e.g. 03_self_attention (default: recognised from the cells)",
    )
    grade.add_argument(
        "--jobs", type=int, default=1, help="notebooks graded at once (default 1)"
    )
    grade.add_argument(
        "--json", action="store_true", help="one JSON object per line per notebook"
    )
    grade.add_argument(
        "--seed", type=int, help="seed for the hidden inputs (default: drawn at random)"
    )
    check = commands.add_parser(
        "check",
        help="prove this machine can grade: the jail, its limits, a right and an "
        "untouched notebook (exit 0 when ready, 3 when not)",
    )
    check.set_defaults(run=_check)
    release = commands.add_parser(
        "release",
        help="the course version, each assignment's digest, and whether the change log "
        "accounts for every grade-changing file changed since the last release (exit 1 "
        "when not)",
    )
    release.add_argument(
        "--record",
        action="store_true",
        help="record every assignment's digest now as the release in VERSION's "
        "(autograder/release.json): run it when cutting a release",
    )
    release.add_argument(
        "--files", action="store_true", help="list the files in each digest"
    )
    release.set_defaults(run=_release)
    autograde = commands.add_parser(
        "autograde",
        help="grade every collected submission of an assignment in parallel and record "
        "it in nbgrader's gradebook, as `nbgrader autograde` would",
    )
    autograde.add_argument("assignment", help="chapter id, e.g. 03_self_attention")
    autograde.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="submissions graded, recorded (and given feedback) at once (default 1)",
    )
    autograde.add_argument(
        "--student", action="append", help="only this student (repeatable)"
    )
    autograde.add_argument(
        "--force", action="store_true", help="grade again those already autograded"
    )
    autograde.add_argument(
        "--seed", type=int, help="seed for the hidden inputs (default: drawn at random)"
    )
    autograde.add_argument(
        "--shard",
        help="K/N: grade only shard K of N (by student id) and write its results to a "
        "file for `merge`, without touching the gradebook",
    )
    autograde.add_argument(
        "--results", type=Path, help="also write the results (JSON lines) here"
    )
    autograde.add_argument(
        "--timestamps",
        type=Path,
        metavar="CSV",
        help="first write each hand-placed submission's time (nbgrader's "
        "timestamp.txt, which the late penalty reads) from a CSV with the columns "
        "student_id and timestamp, e.g. alice,2026-01-16 10:00:00 Europe/Berlin "
        "(no zone: UTC); a submission that has a different time already is refused",
    )
    merge = commands.add_parser(
        "merge", help="record shards' results files in the gradebook"
    )
    merge.add_argument("assignment")
    merge.add_argument("results", nargs="+", type=Path)
    merge.add_argument(
        "--jobs", type=int, default=1, help="submissions recorded at once (default 1)"
    )
    for command in (autograde, merge):
        command.add_argument(
            "--feedback",
            action="store_true",
            help="then write each recorded student's feedback page, as `nbgrader "
            "generate_feedback --force` would, on the same --jobs workers",
        )
    class_report = commands.add_parser(
        "report",
        help="the class report after an autograde: score distributions, the known "
        "mistakes made and failures no known mistake matched, the notebooks to grade "
        "again, the delegation refusals (one HTML page and a CSV)",
    )
    class_report.add_argument(
        "assignment",
        nargs="?",
        help="chapter id, e.g. 03_self_attention; 'all' or none: every assignment "
        "graded so far, with a heat map of students by exercises",
    )
    class_report.add_argument(
        "--names",
        action="store_true",
        help="name the students (their ids), in <name>-named.html and .csv; by default each is 'student N'",
    )
    class_report.add_argument(
        "--out",
        type=Path,
        help="folder for the page and the CSV (default: the course root's reports/)",
    )
    class_report.set_defaults(run=_class_report)
    from autograder.lms import formats as lms_formats

    export = commands.add_parser(
        "export",
        help="the gradebook as an LMS's grade-import CSV (Canvas, Moodle, Blackboard "
        "Learn): every roster student, late penalties as the course's settings give",
    )
    export.add_argument("--lms", required=True, choices=lms_formats.LMSES)
    export.add_argument(
        "--assignment",
        help="one assignment, e.g. 03_self_attention (default: every assignment in the "
        "gradebook, one column each)",
    )
    export.add_argument(
        "--match",
        default="id",
        choices=sorted({f for fields in lms_formats.MATCH.values() for f in fields}),
        help="the nbgrader student field the LMS finds each student by (default id: "
        "nbgrader's student id; Canvas: id or lms_user_id, Moodle: any, Blackboard: id)",
    )
    export.add_argument(
        "--missing",
        default="zero",
        choices=lms_formats.MISSING,
        help="a roster student with no submission: 0, as `nbgrader export` counts it "
        "(default), or an empty cell (a collected submission not in the gradebook is "
        "always left empty)",
    )
    export.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="ASSIGNMENT=HEADER",
        help="the LMS's own name of an assignment's column, as its grade export heads it "
        "(repeatable; default: the assignment id, which makes a new column)",
    )
    export.add_argument(
        "--out",
        type=Path,
        help="the CSV file (default: the course root's exports/<lms>-<assignment or "
        "course>.csv, which git ignores)",
    )
    export.add_argument(
        "--force", action="store_true", help="replace the file if it exists"
    )
    export.set_defaults(run=_export)
    serve = commands.add_parser(
        "serve-submissions",
        help="grade each submission of the assignments switched on in the course's "
        "c.GradeOnSubmit.assignments as it reaches the exchange, and release its "
        "feedback page (deploy/: a systemd unit, a JupyterHub service)",
    )
    serve.add_argument(
        "--exchange",
        type=Path,
        help="nbgrader's exchange root (default: the course config's Exchange.root)",
    )
    serve.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="submissions of different students graded at once (default 2)",
    )
    serve.add_argument(
        "--once",
        action="store_true",
        help="handle the submissions waiting now, then exit (tests, cron)",
    )
    serve.set_defaults(run=_serve_submissions)
    for command in (autograde, merge, class_report, export, serve):
        command.add_argument(
            "--course-dir",
            type=Path,
            help="the nbgrader course root (default: this course's autograder/course/)",
        )
    autograde.set_defaults(run=_autograde)
    merge.set_defaults(run=_merge)
    for command in (grade, check, autograde, serve):
        _limit_arguments(command)
    grade.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run student code without the jail (only for code you trust)",
    )
    grade.set_defaults(run=_grade)
    args = parser.parse_args(argv)
    paths.put_tools_on_path()  # nbgrader's tools, from an environment never activated
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

"""nbgrader's own commands, one after another in one process, each exactly as ``nbgrader
CMD ...`` runs it::

    python -m autograder.grading.recording.nbgrader_steps [--timings FILE] [--nice N] CMD ARGS... [--then CMD ARGS...]
    python -m autograder.grading.recording.nbgrader_steps [--nice N] --serve FD

Run in the course root (nbgrader reads its ``nbgrader_config.py`` there). ``python -m
autograder autograde`` starts one per worker: ``autograde`` over the worker's part of the
class, then, with ``--feedback``, ``generate_feedback`` over the same part; so Python and
nbgrader start once per worker, not once per command. Each command runs as nbgrader's own
test suite runs it in one process (``NbGraderApp.initialize``, ``start``, ``reset``).

With ``--serve FD`` the worker stays up for one command line after another: each line of
its standard input is a request (JSON: ``argv``, the steps as above, and ``verdicts``, the
results file ``nbgrader_bridge.VERDICTS`` names for them), and each reply (JSON:
``status``, ``timings``) is a line written to file descriptor FD. It ends at the end of its
input, or after a request that was stopped. The recording beside the grading
(``RecordingAhead``) sends each run of students to one such worker, so that Python and
nbgrader start once for the class, not once per run.

A later command still runs after one that exits 1 (nbgrader's status when one notebook of
many could not be read: the others were recorded); none runs after status 3 (the jail
cannot start: nothing was recorded). Exits with the largest status. ``--timings`` writes
each command's seconds there (JSON) for the command's summary; ``--nice`` lowers the
worker's CPU priority by N (``RecordingAhead``).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time

THEN = "--then"
SERVE = "--serve"
JAIL_CANNOT_START = 3


def steps(argv: list[str]) -> list[list[str]]:
    """``argv`` split at each ``--then``: one nbgrader command line per step."""
    out = [[]]
    for arg in argv:
        if arg == THEN:
            out.append([])
        else:
            out[-1].append(arg)
    return [step for step in out if step]


def run_step(args: list[str]) -> int:
    """One nbgrader command in this process; its exit status."""
    from jupyter_core.application import NoStart
    from nbgrader.apps import NbGraderApp

    app = NbGraderApp.instance()
    try:
        app.initialize(args)
        app.start()
        status = 0
    except NoStart:  # how a Jupyter application says its subcommand ran
        status = 0
    except SystemExit as exc:
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        app.reset()
    return status


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM: nbgrader removes the notebook it was writing (as on Ctrl-C)
    and this worker ends; the student it was recording has no completion mark
    (``completion.py``), so the next run records them again."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_once(signum, frame) -> None:
    """The first SIGINT or SIGTERM stops the worker; the next ones are ignored, so that
    nbgrader's own clean-up (``_handle_failure``) is not cut short."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def _arm_stop_points() -> None:
    """Tests only (``stop_points.py``): a hard kill half way through writing a
    student's autograded notebook or feedback page."""
    from nbgrader.converters import Autograde, GenerateFeedback

    from autograder.grading.recording.stop_points import armed, half_written

    def wrap(cls, point: str, when=lambda self: True):
        write = cls.write_single_notebook

        def write_single_notebook(self, output, resources):
            student = resources["nbgrader"]["student"]
            if when(self) and armed(point, student):
                folder = self._format_dest(resources["nbgrader"]["assignment"], student)
                os.makedirs(folder, exist_ok=True)
                name = resources["unique_key"] + resources.get("output_extension", "")
                half_written(os.path.join(folder, name), output)
            return write(self, output, resources)

        cls.write_single_notebook = write_single_notebook

    wrap(Autograde, "notebook", lambda self: not self._sanitizing)
    wrap(GenerateFeedback, "feedback")


def main(argv: list[str]) -> int:
    from autograder.grading.recording import gradebook_once, schema_once
    from autograder.grading.recording.stop_points import STOP_AT

    schema_once.install()
    gradebook_once.install()
    timings_file = serve_fd = None
    if argv[:1] == ["--timings"]:
        timings_file, argv = argv[1], argv[2:]
    if argv[:1] == ["--nice"]:  # recording beside the grading: its idle time only
        os.nice(int(argv[1]))
        argv = argv[2:]
    if argv[:1] == [SERVE]:
        serve_fd, argv = int(argv[1]), argv[2:]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop_once)
    if os.environ.get(STOP_AT):
        _arm_stop_points()
    if serve_fd is not None:
        return serve(sys.stdin, serve_fd)
    status, timings = run_steps(argv)
    if timings_file:
        with open(timings_file, "w") as f:
            json.dump(timings, f)
    return status


def run_steps(argv: list[str]) -> tuple[int, list[tuple[str, float]]]:
    """Each step of ``argv`` in turn: the largest exit status (128 + the signal's number
    if the worker was stopped), and each step's seconds."""
    status, timings = 0, []
    for args in steps(argv):
        started = time.perf_counter()
        try:
            step_status = run_step(args)
        except KeyboardInterrupt as stop:  # Stopped, or SIGINT where nbclient put
            # Python's own handler back (a notebook graded in this process)
            signum = getattr(stop, "signum", signal.SIGINT)
            print(
                f"[autograder] recording worker stopped ({signal.Signals(signum).name}): "
                "the student it was recording is recorded again on the next run",
                file=sys.stderr,
                flush=True,
            )
            return 128 + signum, timings
        timings.append((args[0], round(time.perf_counter() - started, 3)))
        status = max(status, step_status)
        if step_status == JAIL_CANNOT_START:
            break
    return status, timings


def serve(requests, reply_fd: int) -> int:
    """One request a line of ``requests``, each reply a line to ``reply_fd``; the status
    of a stopped request, or 0 at the end of the requests."""
    from autograder.grading.nbgrader_bridge import VERDICTS

    with os.fdopen(reply_fd, "w") as replies:
        try:
            for line in requests:
                request = json.loads(line)
                os.environ[VERDICTS] = request["verdicts"]
                status, timings = run_steps(request["argv"])
                replies.write(json.dumps({"status": status, "timings": timings}) + "\n")
                replies.flush()
                if status >= 128:
                    return status
        except KeyboardInterrupt as stop:  # stopped between requests: nothing half done
            return 128 + getattr(stop, "signum", signal.SIGINT)
    return 0


def exit_now(status: int) -> None:
    """End the process with ``status`` once its exit handlers have run and its output is
    flushed, without tearing down every module (about half a second after nbgrader,
    SQLAlchemy and bleach: on the critical path of every worker)."""
    atexit._run_exitfuncs()  # a sandbox this worker started is closed, temp files go
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))

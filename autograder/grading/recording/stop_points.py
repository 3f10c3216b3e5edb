"""Named moments of a class run where a test can kill it, hard (``tests/test_class_stop.py``).

A stop can come at any moment; the tests stop a real run at the moments that matter, by
setting the environment variable ``AUTOGRADER_STOP_AT`` to ``POINT:WHO``. When the run
reaches that point (for that student, or after that many verdicts), the process sends
SIGKILL to its whole process group: the run and its recording workers die at once, as
under ``kill -9``, with nothing flushed or cleaned up. Unset (every normal run), each
point is one dictionary look-up.

Points: ``graded:N`` (the N-th verdict kept, ``autograde.grade_class``), ``gradebook:S``
(nbgrader entered S's submission, the grader wrote the provenance and verdicts, the
scores are not saved yet: ``nbgrader_bridge``), ``notebook:S`` (S's scores are saved,
half of the autograded notebook is written) and ``feedback:S`` (half of S's feedback page
is written), both in ``nbgrader_steps``.
"""

from __future__ import annotations

import os
import signal

STOP_AT = "AUTOGRADER_STOP_AT"


def armed(point: str, who: str | None) -> bool:
    return os.environ.get(STOP_AT) == f"{point}:{who}"


def kill_now() -> None:
    """SIGKILL to this process's group: the whole run, now."""
    os.killpg(os.getpgrp(), signal.SIGKILL)


def stop_point(point: str, who: str | None) -> None:
    if STOP_AT in os.environ and armed(point, who):
        kill_now()


def half_written(path: str, data: bytes | str) -> None:
    """Write the first half of ``data`` to ``path`` and die, as a kill mid-write."""
    if isinstance(data, str):
        data = data.encode()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
    kill_now()

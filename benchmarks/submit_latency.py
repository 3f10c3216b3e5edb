"""Submit-to-feedback latency of grading on submit: a class submitting within a minute.

    python benchmarks/submit_latency.py [--class-size 30] [--window 60] [--seed 0]

A temporary course root and exchange; the service (``python -m autograder
serve-submissions --jobs 2``) started and ready first. Then each student runs nbgrader's
own ``submit`` at a random moment of the window (fixed seed): every other one hands in
right answers, the rest the unscaled-scores slip. A student's latency runs from the
moment their ``nbgrader submit`` returned to the moment their feedback page lies where
``nbgrader fetch_feedback`` finds it. Prints the median and the worst (the goal: worst
<= 30 s) and the machine. The submissions are made as one login under many student
names, so the course's owner check is off here (``c.CollectApp.check_owner = False``).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder.grading.nbgrader_bridge import COURSE_ID  # noqa: E402
from autograder.on_submit import pages  # noqa: E402
from autograder.on_submit.inbound import waiting  # noqa: E402
from tests.notebooks import (  # noqa: E402
    class_course,
    release_notebook,
    student_notebook,
    write,
)

CH = "03_self_attention"
GOAL_SECONDS = 30.0


def course(base: Path) -> tuple[Path, Path]:
    root = class_course(base / "course", CH, {})
    exchange = base / "exchange"
    outbound = exchange / COURSE_ID / "outbound" / CH
    outbound.mkdir(parents=True)
    write(release_notebook(CH), outbound / f"{CH}.ipynb")
    (exchange / COURSE_ID / "inbound").mkdir()
    rules = {CH: {"attempts": 0, "cooldown_minutes": 0, "keep": "last"}}
    with open(root / "nbgrader_config.py", "a") as config:
        config.write(
            f"\nc.Exchange.root = {str(exchange)!r}\n"
            f"c.GradeOnSubmit.assignments = {rules!r}\n"
            "c.CollectApp.check_owner = False\n"
        )
    return root, exchange


def serve(root: Path, log: Path) -> subprocess.Popen:
    """The service, returned once it watches the exchange."""
    process = subprocess.Popen(
        [sys.executable, "-m", "autograder", "serve-submissions", "--jobs", "2",
         "--course-dir", str(root)],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"),  # noqa: SIM115
        env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
    )  # fmt: skip
    while "watching" not in log.read_text():
        if process.poll() is not None:
            sys.exit(f"the service exited:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return process


def submit(base: Path, exchange: Path, student: str, right: bool) -> Path:
    """``nbgrader submit`` as ``student`` from their home; returns their inbound folder."""
    home = base / "homes" / student
    (home / CH).mkdir(parents=True)
    edit = None if right else (lambda s: s.replace(" / math.sqrt(d_k)", ""))
    write(student_notebook(CH, edit), home / CH / f"{CH}.ipynb")
    subprocess.run(
        [sys.executable, "-m", "nbgrader", "submit", CH, f"--student={student}",
         f"--Exchange.root={exchange}", f"--Exchange.cache={home / 'cache'}",
         f"--CourseDirectory.course_id={COURSE_ID}"],
        cwd=home, check=True, capture_output=True,
    )  # fmt: skip
    inbound = exchange / COURSE_ID / "inbound"
    (found,) = [s for s in waiting(inbound, {CH}) if s.student == student]
    return found


def student(base, exchange, name, right, at, start, latencies, timeout):
    time.sleep(max(0.0, start + at - time.monotonic()))
    sub = submit(base, exchange, name, right)
    submitted = time.monotonic()
    page = pages.feedback_path(exchange, COURSE_ID, sub)
    while not page.is_file():
        if time.monotonic() - submitted > timeout:
            latencies[name] = float("inf")
            return
        time.sleep(0.1)
    latencies[name] = time.monotonic() - submitted


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--class-size", type=int, default=30)
    parser.add_argument("--window", type=float, default=60.0, help="seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="give up on a page after this many seconds")  # fmt: skip
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="submit-latency-"))
    try:
        root, exchange = course(base)
        started = time.monotonic()
        service = serve(root, base / "service.log")
        ready = time.monotonic() - started
        rng = random.Random(args.seed)
        moments = sorted(rng.uniform(0, args.window) for _ in range(args.class_size))
        latencies: dict[str, float] = {}
        start = time.monotonic()
        threads = [
            threading.Thread(
                target=student,
                args=(
                    base,
                    exchange,
                    f"s{i:02d}",
                    i % 2 == 0,
                    at,
                    start,
                    latencies,
                    args.timeout,
                ),
            )  # fmt: skip
            for i, at in enumerate(moments)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        os.killpg(service.pid, signal.SIGTERM)
        service.wait(timeout=120)
        values = sorted(latencies.values())
        print(
            f"{args.class_size} students submitting within {args.window:g} s (seed "
            f"{args.seed}), service --jobs 2 ready in {ready:.1f} s"
        )
        print(
            f"submit-to-feedback latency: median {statistics.median(values):.1f} s, "
            f"worst {values[-1]:.1f} s (goal: worst <= {GOAL_SECONDS:g} s: "
            f"{'met' if values[-1] <= GOAL_SECONDS else 'NOT met'})"
        )
        print(f"machine: {machine()}")
        return 0 if all(v != float("inf") for v in values) else 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

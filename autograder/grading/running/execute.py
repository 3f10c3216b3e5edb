"""Run a student's notebook in a kernel: their code cells under time and output limits,
then the probe, which calls their functions on the planned inputs in a sealed child of
the kernel (``window.py``) and saves the raw outputs as plain data. Nothing here judges:
see ``judge.py``."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionComplete, DeadKernelError

from autograder.grading.judging import upstream
from autograder.grading.judging.prepare import PreparedTest
from autograder.grading.running.limits import Limits
from autograder.grading.running.sandbox import interrupt_kernel, kill_kernel
from autograder.grading.running.student_code import is_test_cell
from autograder.grading.sealed import guard, probe, python_attention, result_reader
from autograder.grading.sealed.window import SealedWindow


class QuietClient(NotebookClient):
    """Keeps only error names and messages. Everything else the kernel sends (printed
    text, display data, widget state in comm messages) is counted and dropped, so a cell
    that sends gigabytes costs the grader nothing; past ``output_limit`` bytes in all,
    the cell is interrupted."""

    output_limit: int = 10 * 2**20
    printed: int = 0
    flooded_cell: int | None = None

    def process_message(self, msg, cell, cell_index):
        """Every message a cell's run sends passes here. nbclient's own would store
        outputs, display ids and widget state (``handle_comm_msg``) and run widget
        handlers on the student's comm messages; this stores nothing but an error."""
        self._count(msg, cell_index)
        content = msg["content"]
        if msg["msg_type"] == "status" and content.get("execution_state") == "idle":
            raise CellExecutionComplete()
        if msg["msg_type"] == "error":
            cell.outputs[:] = [
                {
                    "ename": str(content.get("ename", ""))[:100],
                    "evalue": str(content.get("evalue", ""))[:300],
                }
            ]
        return None

    def _count(self, msg, cell_index: int) -> None:
        """Add the message's size to what the notebook sent; interrupt a flood."""
        self.printed += len(str(msg["content"])) + sum(
            memoryview(b).nbytes for b in msg.get("buffers") or ()
        )
        if self.printed > self.output_limit and self.flooded_cell is None:
            self.flooded_cell = cell_index
            self._interrupt()

    def _interrupt(self) -> None:
        interrupt_kernel(self.km)


def _probe_setup_cell() -> str:
    source = Path(probe.__file__).read_text()
    return (
        "import types as _grader_types\n"
        "_grader_probe = _grader_types.ModuleType('_grader_probe')\n"
        f"exec(compile({source!r}, '<grader probe>', 'exec'), _grader_probe.__dict__)\n"
        f"_grader_probe.PYTHON_ATTENTION = {python_attention.by_code_key()!r}\n"
        f"_grader_probe.REFUSAL_TAIL = {guard.MESSAGE_TAIL!r}\n"
    )


@dataclass
class Run:
    """What happened while the notebook ran, for the messages."""

    errors: list[str]
    died_in_cell: int | None = (
        None  # the student's code cell during which the kernel died
    )
    died_in_test: bool = (
        False  # the kernel died while a hidden test called student code
    )
    start_failed: str | None = None  # why the kernel never ran a cell (not the student)
    grader_fault: str | None = None  # the grader failed while the tests ran: no grade
    # when the first student cell and the probe started, and when the run ended
    # (time.perf_counter()), for the benchmark's "where the time goes"
    marks: dict[str, float] = field(default_factory=dict)
    # for the instructor's review, read from the student's code (``delegation.flags``)
    flags: list[str] = field(default_factory=list)
    # each test's second run, with the course's stand-ins for the earlier exercises it
    # uses (``upstream.py``), by the test's index: its raw outcomes, as ``got``'s
    second_runs: dict[int, list[dict] | str | None] = field(default_factory=dict)
    # the student's code cells (numbers, as in the messages) interrupted at a time limit
    timed_out_cells: list[int] = field(default_factory=list)


def run_notebook(
    nb,
    prepared: list[PreparedTest],
    km,
    workdir: Path,
    limits: Limits,
    skip: frozenset[str] = frozenset(),
    passed: Callable[[int, list[dict] | str | None], bool] | None = None,
) -> tuple[list[list[dict] | str | None], Run]:
    """Execute the student's code cells, then the probe, which runs every hidden test in
    a sealed window (``window.py``); returns each test's raw outcomes (None where none
    came back) and what went wrong. ``passed(i, outcomes)``: whether test ``i`` passes
    on these outcomes of the student's own code, when its second run (with stand-ins) is
    then not needed (the judge looks at it only when the first fails)."""
    student, numbers = _student_cells(nb, skip)
    twice = [i for i, p in enumerate(prepared) if p.stand_ins]  # a second run too
    plans = [p.test_plan for p in prepared] + [prepared[i].second_plan for i in twice]
    oracle = None
    if twice:
        reference = vars(sys.modules[prepared[twice[0]].reference_module])
        oracle = upstream.ReferenceServer(reference)

    def settled(index: int) -> bool:  # the index of a second run among the plans
        test = twice[index - len(prepared)]
        return passed is not None and passed(test, _read_result(window.results[test]))

    window = SealedWindow(
        lambda: _kernel_pid(km),
        workdir,
        {"tests": plans, "seconds": limits.test},
        seconds=limits.test,
        wait=limits.startup,
        max_bytes=int(limits.result_mb * 2**20),
        guard=guard.library_path(),
        oracle=oracle,
        settled=settled,
    )
    probes = _probe_cells(workdir, limits.startup, str(guard.library_path()))
    probe_time = limits.startup + limits.test * len(plans) + 30
    client, current = _client(
        student + probes, len(student), km, workdir, limits, probe_time
    )
    run = Run(errors=[])
    # opened as the probe's setup cell starts: the student's cells have all run, and the
    # kernel is not yet forking the tests' process
    client.on_cell_start = _start_window_at(len(student), current, window, run.marks)
    # A cell that ignores interrupts cannot outlast this: the kernel is shut down.
    hard_stop = limits.notebook + probe_time + limits.startup + 30
    watchdog = threading.Timer(hard_stop, lambda: kill_kernel(km))
    watchdog.start()
    try:
        client.execute(env=_kernel_environment())
    except DeadKernelError:
        if current["index"] < 0:
            run.start_failed = "the kernel died before it ran the first cell"
        elif current["index"] < len(student):
            run.died_in_cell = numbers[current["index"]]
        else:
            run.died_in_test = True
    except Exception as exc:  # noqa: BLE001 (nbclient's own failures become messages)
        why = f"{type(exc).__name__}: {exc}"[:300]
        if current["index"] < 0:  # no student code has run: the kernel failed to start
            run.start_failed = why
        else:
            run.errors.append(f"the notebook could not be run: {why}")
    finally:
        run.marks["end"] = time.perf_counter()
        watchdog.cancel()
        atexit.unregister(client._cleanup_kernel)  # we end the kernel ourselves
        _close_client(client)
    if window.ident is not None:  # started: it ends within its own time limits
        window.join()
    run.died_in_test = run.died_in_test or window.ended_early
    run.grader_fault = window.fault
    if window.problem and not run.died_in_test:
        run.errors.append(window.problem)
    run.errors += _problems(client, numbers, limits)
    run.timed_out_cells = _timed_out(client, numbers)
    got = [_read_result(raw) for raw in window.results]
    run.second_runs = dict(zip(twice, got[len(prepared) :], strict=True))
    return got[: len(prepared)], run


def _start_window_at(index: int, current: dict, window: SealedWindow, marks: dict):
    """nbclient's cell-start hook: note the cell (and when the first cell and the
    probe started, in ``marks``), and open the window when the probe's setup cell
    (``index``) starts: the student's cells have all run."""

    def on_cell_start(cell, cell_index):
        current["index"] = cell_index
        if cell_index == 0:
            marks["cells"] = time.perf_counter()
        if cell_index == index:
            marks["tests"] = time.perf_counter()
            window.open()

    return on_cell_start


def _kernel_pid(km) -> int | None:
    """The kernel's process: the sandbox's zygote notes it (``Sandbox.kernel``); a
    plain local kernel is the process Jupyter started."""
    if hasattr(km, "kernel_pid"):
        return km.kernel_pid()
    process = getattr(getattr(km, "provisioner", None), "process", None)
    return None if process is None else process.pid


def _student_cells(nb, skip: frozenset[str]) -> tuple[list, list[int]]:
    """The student's cells that run (test cells and unchanged ``skip`` cells do not), and
    each one's number among the notebook's code cells (for messages)."""
    code = [c for c in nb.cells if c.get("cell_type") == "code"]
    numbers = [
        n + 1
        for n, c in enumerate(code)
        if not is_test_cell(c) and c.source not in skip
    ]
    return [nbformat.v4.new_code_cell(code[n - 1].source) for n in numbers], numbers


def _probe_cells(workdir: Path, wait: float, guard_path: str) -> list:
    """The probe's setup cell, then the cell that forks the sealed child and waits for
    it. Neither holds anything secret: the plans arrive later, through the window."""
    call = (
        f"_grader_probe.run_sealed(globals(), {str(workdir)!r}, {float(wait)!r}, "
        f"{guard_path!r})"
    )
    return [
        nbformat.v4.new_code_cell(_probe_setup_cell()),
        nbformat.v4.new_code_cell(call),
    ]


def _close_client(client: QuietClient) -> None:
    """Close the kernel client's channels and its ZeroMQ context: nbclient leaves both
    open when it did not start the kernel, and every graded notebook would keep a
    heartbeat thread and about a dozen file descriptors until the batch runs out of them."""
    kc = client.kc
    if kc is None:
        return
    kc.stop_channels()
    if kc._created_context:
        kc.context.destroy(linger=0)
    client.kc = None


def _client(cells, n_student: int, km, workdir: Path, limits: Limits, probe_time):
    """An nbclient for ``cells`` whose first ``n_student`` are the student's, with their
    time limits (the probe's cells get ``probe_time``); also the index of the cell being
    run (-1 before the first)."""
    deadline = time.monotonic() + limits.notebook
    # set by the cell-start hook before nbclient asks for a timeout
    current = {"index": -1}

    def timeout_for(cell) -> int:
        if current["index"] >= n_student:
            return max(1, int(probe_time))
        return max(1, int(min(limits.cell, deadline - time.monotonic())))

    client = QuietClient(
        nbformat.v4.new_notebook(cells=cells),
        km=km,
        timeout_func=timeout_for,
        startup_timeout=int(limits.startup),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={"ename": "TimeoutError", "evalue": "past its time limit"},
        kernel_name="python3",
        # an error's name and message are kept, never its traceback (slow to format)
        extra_arguments=["--log-level=ERROR", "--InteractiveShell.xmode=Minimal"],
        resources={"metadata": {"path": str(workdir)}},
    )
    client.output_limit = int(limits.output_mb * 2**20)
    return client, current


def _problems(client: QuietClient, numbers: list[int], limits: Limits) -> list[str]:
    """What went wrong in the student's cells: floods of output, time limits, errors."""
    problems = []
    if client.flooded_cell is not None:
        where = (
            f"code cell {numbers[client.flooded_cell]}"
            if client.flooded_cell < len(numbers)
            else "a hidden test"
        )
        problems.append(
            f"{where} printed more than {limits.output_mb:g} MB and was interrupted"
        )
    for i, cell in enumerate(client.nb.cells[: len(numbers)]):
        for out in cell.get("outputs", []):
            if out.get("ename") in ("TimeoutError", "KeyboardInterrupt"):
                # only our limits interrupt
                problems.append(
                    f"code cell {numbers[i]} ran past its time limit and was interrupted"
                )
            else:
                problems.append(
                    f"code cell {numbers[i]}: {out.get('ename')}: {out.get('evalue')}"
                )
    return problems


def _timed_out(client: QuietClient, numbers: list[int]) -> list[int]:
    """The student's code cells that our time limits interrupted (their numbers)."""
    return [
        numbers[i]
        for i, cell in enumerate(client.nb.cells[: len(numbers)])
        if any(
            out.get("ename") in ("TimeoutError", "KeyboardInterrupt")
            for out in cell.get("outputs", [])
        )
    ]


def _read_result(raw: bytes | str | None) -> list[dict] | str | None:
    """A test's outcomes, decoded and validated (the student's code may have shaped
    them); None when none came, a message for the student when they are no result."""
    if raw is None or isinstance(raw, str):
        return raw
    return result_reader.decode(raw)


def _kernel_environment() -> dict[str, str]:
    """The student's kernel gets no path to the course's code, and draws no figures."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JPY_PARENT_PID")
    }
    env["MPLBACKEND"] = (
        "Agg"  # plt.show() becomes a no-op: figures cost time and are not graded
    )
    env["TRITON_INTERPRET"] = "1"  # the hidden tests pass CPU tensors, GPU or not
    return env

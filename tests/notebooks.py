"""Notebooks for the tests and benchmarks: the derived notebooks, student notebooks
answered right or wrong, and running or grading them."""

import functools
import getpass
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from autograder import paths
from autograder.build.solution_cells import BEGIN, END
from autograder.grading.judging.spec import graded_chapters

CHAPTERS = graded_chapters()


def _is_solution(cell) -> bool:
    return cell.get("metadata", {}).get("nbgrader", {}).get("solution", False)


def release_notebook(chapter: str):
    return nbformat.read(paths.release_notebook(chapter), as_version=4)


def source_notebook(chapter: str):
    return nbformat.read(paths.nbgrader_source(chapter), as_version=4)


def answers(chapter: str) -> dict[str, str]:
    """The reference answer of every exercise cell, by grade id, without nbgrader's markers."""
    return {
        cell.metadata.nbgrader.grade_id: "\n".join(
            line
            for line in cell.source.splitlines()
            if line.strip() not in (BEGIN, END)
        )
        for cell in source_notebook(chapter).cells
        if _is_solution(cell)
    }


def student_notebook(chapter: str, edit: Callable[[str], str] | None = None):
    """The released notebook as a student who copied the reference would submit it;
    ``edit`` changes each answer (to make a plausible wrong one)."""
    nb = release_notebook(chapter)
    filled = answers(chapter)
    for cell in nb.cells:
        if _is_solution(cell):
            cell.source = filled[cell.metadata.nbgrader.grade_id]
            if edit is not None:
                cell.source = edit(cell.source)
    return nb


def write(nb, path: Path) -> Path:
    nbformat.write(nb, path)
    return path


def class_course(
    root: Path,
    chapter: str,
    submissions: dict[str, Callable[[], object] | None],
    timestamps: dict[str, str] | None = None,
    exist_ok: bool = False,
) -> Path:
    """An nbgrader course root at ``root`` with the course's config and sources, and one
    collected submission of ``chapter`` per student (``None``: a file that is no notebook),
    with nbgrader's timestamp where ``timestamps`` gives one. ``exist_ok``: add to a
    course root made before (for another chapter)."""
    import shutil

    if not (exist_ok and root.exists()):
        root.mkdir(parents=True)
        shutil.copy(paths.COURSE_ROOT / "nbgrader_config.py", root)
        shutil.copytree(paths.COURSE_ROOT / "source", root / "source")
    for student, make in submissions.items():
        folder = root / "submitted" / student / chapter
        folder.mkdir(parents=True)
        if make is None:
            (folder / f"{chapter}.ipynb").write_text('{"cells": [')
        else:
            write(make(), folder / f"{chapter}.ipynb")
        if timestamps and student in timestamps:
            (folder / "timestamp.txt").write_text(timestamps[student])
    return root


def gradebook_entries(root: Path, chapter: str, students) -> dict[str, dict]:
    """What nbgrader's gradebook in ``root`` holds for each of ``students`` who has a
    submission of ``chapter``: total, late penalty, timestamp and each graded cell's
    (name, score, needs manual grade), as nbgrader reads them."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.grading.nbgrader_bridge import COURSE_ID

    found = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE_ID) as gb:
        for student in students:
            try:
                sub = gb.find_submission(chapter, student)
            except MissingEntry:
                continue
            (notebook,) = sub.notebooks
            found[student] = {
                "total": sub.score,
                "penalty": sub.late_submission_penalty,
                "timestamp": sub.timestamp,
                "cells": sorted(
                    (g.name, g.auto_score, g.needs_manual_grade)
                    for g in notebook.grades
                ),
            }
    return found


# Limits for batches of chapter 3 attacks: its hidden tests take milliseconds, so a
# notebook that keeps the grader waiting (a test process that never starts or never arms
# its guard) costs seconds, not the defaults' minutes. Honest neighbours keep full marks.
QUICK_LIMITS = ("--startup-timeout", "20", "--test-timeout", "5")


@functools.cache
def login_environment() -> dict[str, str]:
    """What a fresh login shell of this user has, and nothing of the test process's own
    environment (which importing the course's solutions changes: chapter 11's sets
    ``TRITON_INTERPRET``)."""
    shell = subprocess.run(
        ["env", "-i", f"HOME={Path.home()}", f"USER={getpass.getuser()}",
         "bash", "-l", "-c", "env -0"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    pairs = (entry.split("=", 1) for entry in shell.stdout.decode().split("\0"))
    return {p[0]: p[1] for p in pairs if len(p) == 2 and p[0] not in ("_", "PWD")}


def user_environment(**extra: str) -> dict[str, str]:
    """The environment a user's command starts with (``login_environment``), plus
    ``extra``: the grader, the class run, nbgrader and the services are started with
    this in the tests, never with the test process's own environment."""
    return {**login_environment(), **extra}


def run_python(code: str, timeout=300, **kwargs):
    """``python -c CODE`` in the repository, in a process of its own (a module blocked,
    an environment changed), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=paths.REPO, capture_output=True, text=True,
        timeout=timeout, **kwargs,
    )  # fmt: skip


def grade_cli(*args, timeout=600):
    """``python -m autograder grade ARGS...``, run as an instructor would."""
    return subprocess.run(
        [sys.executable, "-m", "autograder", "grade", *map(str, args)],
        cwd=paths.REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=user_environment(),
    )


def with_extra_cell(nb, source, after_grade_id):
    """``nb`` with a code cell of ``source`` inserted after the cell ``after_grade_id``."""
    for i, cell in enumerate(nb.cells):
        if (
            cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            == after_grade_id
        ):
            nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
            return nb
    raise AssertionError(after_grade_id)


def scores_by_test(result):
    """A grading result's score by test id."""
    return {t["id"]: t["score"] for t in result["tests"]}


def run_cells(sandbox, *sources):
    """Run cells in a fresh jailed kernel; returns each cell's printed text or error."""
    return run_cells_to_end(sandbox, *sources)[0]


def run_cells_to_end(sandbox, *sources):
    """``run_cells``, and how the kernel ended (``KernelEnd``: its peak memory)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    with sandbox.kernel() as (km, workdir):
        client = NotebookClient(
            nb, km=km, allow_errors=True, timeout=60,
            resources={"metadata": {"path": str(workdir)}},
        )  # fmt: skip
        client.execute()
        end = sandbox.end(km, workdir)
    texts = []
    for cell in client.nb.cells:
        texts.append(
            "".join(
                o.get("text", "") or f"{o.get('ename')}: {o.get('evalue')}"
                for o in cell.outputs
            )
        )
    return texts, end


# What an honest student's notebook holds besides the answers: scratch cells of their
# own, none of which touches an exercise's answer.
COLAB_CELLS = [
    "!pip -q install nothing-at-all || true",
    'import sys\nIN_COLAB = "google.colab" in sys.modules\n'
    "if IN_COLAB:\n"
    "    from google.colab import drive\n"
    '    drive.mount("/content/drive")',
]
SCRATCH_CELLS = [
    "import multiprocessing\nprint(multiprocessing.cpu_count())",
    "import threading\nthreading.Thread(target=lambda: None).start()",
    "import torch\nimport torch.nn.functional as F\n"
    "q_mine = torch.randn(1, 4, 8)  # compare with PyTorch, outside the answer\n"
    "print(F.scaled_dot_product_attention(q_mine, q_mine, q_mine).shape)",
    "import torch\ntorch.backends.cudnn.deterministic = True\n"
    "with torch.profiler.profile() as prof:\n"
    "    torch.ones(2) + 1\n"
    "print(len(prof.key_averages()))",
    # counting calls with a mode of their own, as chapter 7 teaches
    "import torch\nfrom torch.overrides import TorchFunctionMode\n"
    "class CountCalls(TorchFunctionMode):\n"
    "    calls = 0\n"
    "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
    "        CountCalls.calls += 1\n"
    "        return func(*args, **(kwargs or {}))\n"
    "with CountCalls():\n"
    "    torch.ones(3).softmax(-1).sum()\n"
    "print(CountCalls.calls)",
    # PyTorch's own module tried on a random tensor, touching no answer
    "import torch\nmha_mine = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()\n"
    "x_mine = torch.randn(1, 4, 8)\n"
    "with torch.no_grad():\n"
    "    print(mha_mine(x_mine, x_mine, x_mine)[0].shape)",
]


def honest_notebook(chapter: str):
    """The reference answers, as a student who tinkers would submit them: a harmless
    line added to every code cell (answers, and the course's own cells, which the
    grader restores), the Colab set-up cells they pasted at the top, and scratch cells
    at the end."""
    nb = student_notebook(chapter)
    for cell in nb.cells:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get(
            "grade"
        ):
            cell.source += '\nprint("hi")  # a harmless line'
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells[first:first] = [nbformat.v4.new_code_cell(s) for s in COLAB_CELLS]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in SCRATCH_CELLS]
    return nb


_HOGS = {
    # SysV segments, detached: no process maps them
    "sysv": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range({chunks}):
    segment = libc.shmget(0, 100 * 2**20, 0o1000 | 0o600)
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 100 * 2**20)
    libc.shmdt(ctypes.c_void_p(address))
""",
    # memfd files held only by a descriptor
    "memfd": """
import os
held = []
for _ in range({chunks}):
    held.append(os.memfd_create("hog"))
    for _ in range(100):
        os.write(held[-1], b"x" * 2**20)
""",
    # files in the jail's tmpfs mounts
    "tmpfs": """
for i in range({chunks}):
    with open(f"{{('/dev/shm', '/tmp', '/submission')[i % 3]}}/hog{{i}}", "wb") as f:
        for _ in range(100):
            f.write(b"x" * 2**20)
""",
    # shared anonymous memory, mapped
    "mmap": """
import mmap
held = mmap.mmap(-1, {chunks} * 100 * 2**20)
for i in range(0, len(held), 4096):
    held[i] = 1
""",
}


def memory_hog(form: str, mb: int) -> str:
    """A cell that holds ``mb`` MB (a multiple of 100) as ``form`` for two seconds."""
    return _HOGS[form].format(chunks=mb // 100) + "import time; time.sleep(2)\n"

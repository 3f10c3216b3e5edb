"""The sealed process of the hidden tests can load no new machine code: no executable
mapping, no anonymous file to load from (issue 38), on top of no thread, process or exec."""

import subprocess
import sys

from autograder import paths

# Seals a fresh process as the probe does, then tries each route; prints what happened.
TRY = """
import ctypes, mmap, os, sys
sys.path.insert(0, sys.argv[1])
import torch
from autograder.grading.sealed import probe
torch.set_num_threads(1)  # as the probe's child: sealed, it can start no thread
probe.seal()
def attempt(name, action):
    try:
        action()
        print(name, "allowed")
    except (OSError, PermissionError, ValueError) as exc:
        print(name, "refused", type(exc).__name__)
attempt("memfd_create", lambda: os.memfd_create("code"))
attempt("exec mmap", lambda: mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC))
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(8192)
aligned = (ctypes.addressof(buf) + 4095) & ~4095
def mprotect_exec():
    if libc.mprotect(ctypes.c_void_p(aligned), 4096, 5) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
attempt("exec mprotect", mprotect_exec)
attempt("plain mmap", lambda: mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE))
attempt("tensor work", lambda: (torch.randn(64, 64) @ torch.randn(64, 64)).sum().item())
"""


def test_the_sealed_process_loads_no_new_machine_code():
    run = subprocess.run(
        [sys.executable, "-c", TRY, str(paths.REPO)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout
    assert "memfd_create refused" in lines, lines
    assert "exec mmap refused" in lines, lines
    assert "exec mprotect refused" in lines, lines
    assert "plain mmap allowed" in lines, lines  # data still maps
    assert "tensor work allowed" in lines, lines

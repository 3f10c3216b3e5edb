"""The attention guard: PyTorch's attention kernels switched off, one way, in the process
that runs the hidden tests which forbid them (``guard.cpp``).

``ensure()`` compiles the guard once per PyTorch version and source (a few tens of
seconds) into a cache folder and returns the path of the shared library; the sandbox's
zygote loads it before any student code (``sandbox/zygote.py``), and the sealed child
arms it by adding seccomp filters, which nothing in Python can take away. Where it cannot
be built or loaded, ``GuardUnavailable`` says why: nothing is graded without it.

Measured on the 2-core CI machine (torch 2.13 CPU): about 12 s to compile (10 s of CPU),
under 1 ms to load, and no difference measurable above the machine's noise in a call of
PyTorch's attention while unarmed (one ``prctl`` per call; about 6 to 9 us a call of a tiny
``scaled_dot_product_attention`` either way). Tried routes: ``tests/guard_routes.py``.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from autograder import paths

_HERE = Path(__file__).parent
SOURCE = _HERE / "guard.cpp"
NAME = "attention_guard"
# Where the compiled library is kept; the environment variable moves it.
CACHE_ENV = "ATTENTION_COURSE_CACHE"

# The one message a refused call carries (guard.cpp writes the same after the name of the
# switched-off function); the judge shows it as the test's message.
MESSAGE_TAIL = (
    "is switched off while this exercise's hidden tests run: write the attention "
    "yourself (scores = q @ k^T / sqrt(d), masked softmax, weights @ v)."
)
MARK = "PyTorch's attention ("  # how a refusal begins

# The forbidden features (``delegation.FEATURES``) that the guard switches off: a test
# that forbids one of them runs in the second phase, armed.
ATTENTION_FEATURES = frozenset({"sdpa", "mha", "transformer_layer"})


def refusal(name: str) -> str:
    return f"{MARK}{name}) {MESSAGE_TAIL}"


class GuardUnavailable(RuntimeError):
    """The guard could not be built or loaded: a grader fault, never a student's."""


def _cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return Path(base) / "attention-course"


def _key() -> str:
    """The guard's source, this Python and this PyTorch build (its ``version.py``: the
    version, CUDA's and the commit), read without importing PyTorch, which takes seconds
    and would hold back the jail's warm process (``Sandbox``)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise GuardUnavailable("PyTorch is not installed; nothing is graded without it")
    build = (Path(spec.origin).parent / "version.py").read_text()
    version = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", build, re.M)
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(build.encode())
    digest.update(sys.version.encode())
    name = version.group(1).replace("+", "_") if version else "unknown"
    return f"torch-{name}-{digest.hexdigest()[:16]}"


def library_path() -> Path:
    """Where the compiled guard for this PyTorch and source lies (built or not)."""
    return _cache_root() / "guard" / _key() / f"{NAME}.so"


_BUILD = """
import sys
from torch.utils import cpp_extension
cpp_extension.load(name={name!r}, sources=[{source!r}], build_directory={folder!r},
                   is_python_module=False, verbose=False,
                   extra_cflags=["-O2"])
"""


def ensure(timeout: float = 900.0) -> Path:
    """The compiled guard's path, built first if needed (once per machine, under a file
    lock so that parallel graders build it once). Raises ``GuardUnavailable``."""
    path = library_path()
    if path.exists():
        return path
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.exists():
                return path
            script = _BUILD.format(name=NAME, source=str(SOURCE), folder=str(folder))
            # a child process: the grader itself never loads the guard
            done = subprocess.run(
                [sys.executable, "-c", script],
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, "PATH": paths.path_with_tools()},  # pip's ninja
            )
            if done.returncode != 0 or not path.exists():
                tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
                raise GuardUnavailable(
                    "the attention guard could not be compiled "
                    f"({' | '.join(tail) or 'no output'}). It needs a C++ compiler (g++) "
                    "and ninja (`pip install ninja`); nothing is graded without it."
                )
    except OSError as exc:
        raise GuardUnavailable(
            f"the attention guard could not be built in {folder} ({exc}); set "
            f"{CACHE_ENV} to a writable folder. Nothing is graded without it."
        ) from None
    except subprocess.TimeoutExpired:
        raise GuardUnavailable(
            "compiling the attention guard took too long; nothing is graded without it"
        ) from None
    return path


def mapped(pid: int | str, path: Path | str) -> bool:
    """Whether process ``pid`` maps the guard library (read from outside, /proc)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(line.rstrip("\n").endswith(str(path)) for line in f)
    except OSError:
        return False

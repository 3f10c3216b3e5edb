"""Every limit a submission runs under, in one place (the README's instructor section lists
them with their command-line flags). A submission that hits one gets a message saying which,
and loses only what it did not finish; the rest of the batch never notices."""

from dataclasses import dataclass, field


@dataclass
class Limits:
    # time, in seconds
    cell: float = 60.0  # one code cell of the student's notebook
    notebook: float = 300.0  # all of the student's cells together
    test: float = 30.0  # one hidden test's calls of the student's code
    startup: float = 60.0  # starting a kernel
    # space
    memory_mb: int = (
        8192  # address space of the kernel (RLIMIT_AS); past it, MemoryError
    )
    output_mb: float = (
        10.0  # text and images a cell may print; past it, it is interrupted
    )
    disk: str = "256m"  # size of each of /submission, /tmp and /dev/shm (tmpfs)
    file_mb: int = 256  # largest file the kernel may write (RLIMIT_FSIZE)
    result_mb: int = 256  # largest result file the grader will read back
    # PyTorch and OpenMP threads per kernel; keep jobs x threads <= cores
    threads: int = 1
    hide: list[str] = field(default_factory=list)  # more paths kept out of the sandbox

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
    # all the memory a submission holds together, its processes', tmpfs files' and shared
    # memory's (the sandbox's watch kills the largest process past it, or the kernel),
    # and the address space of each process (RLIMIT_AS; past it, MemoryError). Sampled,
    # every watch_period and down to every 5 ms as it nears the limit: a kernel is
    # stopped before it holds more than the limit plus a margin of 256 MB, whatever the
    # machine's load (measured: at most 2089 MB under 2048, four threads filling shared
    # memory, idle and with four busy processes per core; tests/test_sandbox.py). Its
    # SysV segments together are capped at the limit plus that margin (its IPC
    # namespace's shmall).
    memory_mb: int = 8192
    output_mb: float = (
        10.0  # text and images a cell may print; past it, it is interrupted
    )
    # size of each of /submission, /tmp and /dev/shm (tmpfs: it counts as memory too)
    disk: str = "256m"
    file_mb: int = 256  # largest file the kernel may write (RLIMIT_FSIZE)
    # all the result files of one submission's hidden tests together: what the grader
    # reads back (the largest right answer's are under 2 MB); its memory for them stays
    # under result_reader.MEMORY_FACTOR times this, whatever the files hold
    result_mb: int = 32
    # the student's own code (code cells other than the course's, unchanged) the grader
    # reads: parsing code takes about 180 times its size in memory, so past this the
    # notebook is not graded (a message says why); the largest chapter's own code is
    # under 30 KB, and an edited copy of its largest given cell 130 KB
    code_kb: int = 256
    # all a kernel may write to its kernel directory, on the grader's disk (its result
    # files, its log): past it, or past 4096 files, the kernel is killed
    kernel_dir_mb: int = 256
    processes: int = 256  # processes and threads of one submission (RLIMIT_NPROC)
    watch_period: float = 0.2  # seconds between two samples of a submission's memory
    # PyTorch and OpenMP threads per kernel; keep jobs x threads <= cores
    threads: int = 1
    # a grader run by root runs each kernel as its own unprivileged uid, from this one
    kernel_uid: int = 2_000_000_000
    hide: list[str] = field(default_factory=list)  # more paths kept out of the sandbox

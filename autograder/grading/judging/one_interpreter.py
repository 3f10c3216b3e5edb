"""One Triton kernel at a time in the grader's process.

Triton's interpreter runs a kernel by patching ``triton.language`` for the whole process
while it runs, and puts it back when it ends: two kernels run at once by two of the
grader's threads undo each other's patches, and one of them fails ("Did you forget to
add @triton.jit?"), a fault of the grader's that would read as a wrong answer. The
grader computes the reference (chapter 11's kernels among it) under this lock: when it
prepares a batch's tests and when it answers a stand-in (``upstream.ReferenceServer``).
Students' kernels run in processes of their own, one thread each.
"""

import threading

LOCK = threading.RLock()

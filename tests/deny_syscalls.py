"""Run a command as on a host whose security settings refuse the jail's system calls:
``python tests/deny_syscalls.py unshare,mount -- COMMAND...``.

A seccomp filter (inherited by every process the command starts) makes each named call
fail with EPERM, as Docker's default profile does for ``unshare`` and as Ubuntu's AppArmor
restriction does for ``mount`` inside an unprivileged user namespace.
"""

import ctypes
import os
import platform
import struct
import sys

ARCH = {  # AUDIT_ARCH_* and the numbers of the calls we may deny
    "x86_64": (0xC000003E, {"unshare": 272, "mount": 165, "pivot_root": 155}),
    "aarch64": (0xC00000B7, {"unshare": 97, "mount": 40, "pivot_root": 41}),
}
LD_ABS_W, JEQ_K, RET_K = 0x20, 0x15, 0x06
ALLOW, ERRNO_EPERM = 0x7FFF0000, 0x00050000 | 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def _instruction(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


def deny(names):
    audit_arch, numbers = ARCH[platform.machine()]
    calls = [numbers[n] for n in names]
    program = [
        _instruction(LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        _instruction(JEQ_K, 1, 0, audit_arch),
        _instruction(RET_K, 0, 0, ALLOW),
        _instruction(LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
    ]
    for i, number in enumerate(calls):
        remaining = len(calls) - i - 1
        program.append(_instruction(JEQ_K, remaining + 1, 0, number))
    program += [
        _instruction(RET_K, 0, 0, ALLOW),
        _instruction(RET_K, 0, 0, ERRNO_EPERM),
    ]
    code = b"".join(program)
    buffer = ctypes.create_string_buffer(code)
    fprog = struct.pack("HxxxxxxQ", len(program), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    fprog_buffer = ctypes.create_string_buffer(fprog)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog_buffer, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


if __name__ == "__main__":
    separator = sys.argv.index("--")
    deny(sys.argv[1].split(","))
    command = sys.argv[separator + 1 :]
    os.execvp(command[0], command)

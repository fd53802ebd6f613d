"""``python noptrace.py CMD...``: run CMD where ptrace is denied, as in a default docker or podman container.

Those engines' default seccomp profile refuses ``ptrace`` and ``process_vm_readv`` to a
container without ``CAP_SYS_PTRACE`` (py-spy's way in).  This installs the same refusal (EPERM)
as a seccomp filter, which every descendant inherits and cannot lift, then execs CMD.
x86_64 and aarch64 only (the syscall numbers below).
"""

import ctypes
import errno
import os
import platform
import struct
import sys

_SYSCALLS = {"x86_64": (101, 310), "aarch64": (117, 270)}  # ptrace, process_vm_readv
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL = 0x7FFF0000, 0x00050000, 0
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06


def _insn(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


def deny_ptrace() -> None:
    machine = platform.machine()
    ptrace, vm_readv = _SYSCALLS[machine]
    program = b"".join([
        _insn(BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _insn(BPF_JEQ_K, 1, 0, _AUDIT_ARCH[machine]),
        _insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL),
        _insn(BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        _insn(BPF_JEQ_K, 2, 0, ptrace),
        _insn(BPF_JEQ_K, 1, 0, vm_readv),
        _insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        _insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
    ])
    buf = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")


if __name__ == "__main__":
    deny_ptrace()
    os.execvp(sys.argv[1], sys.argv[1:])

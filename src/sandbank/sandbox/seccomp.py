"""The seccomp filter every sandboxed process runs under, as a raw BPF program for bwrap.

A deny list on top of namespaces, no capabilities and no-new-privs: the calls below either
reach kernel surface a sandbox never needs or would let it build a new sandbox of its own.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

from ..errors import IsolationUnavailable

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# x86_64 syscall numbers.
DENIED: dict[str, int] = {
    "unshare": 272,
    "setns": 308,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "bpf": 321,
    "perf_event_open": 298,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "reboot": 169,
    "swapon": 167,
    "swapoff": 168,
    "acct": 163,
    "userfaultfd": 323,
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    "syslog": 103,
    "lookup_dcookie": 212,
    "quotactl": 179,
    "iopl": 172,
    "ioperm": 173,
    "settimeofday": 164,
    "clock_settime": 227,
    "clock_adjtime": 305,
    "adjtimex": 159,
    "vhangup": 153,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
CLONE = 56
CLONE3 = 435
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000
CLONE_NAMESPACE_FLAGS |= 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000


def _errno(code: int) -> int:
    return 0x00050000 | code


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_filter() -> bytes:
    """The filter as `struct sock_filter[]` bytes, the format `bwrap --seccomp FD` reads."""
    if platform.machine() != "x86_64":
        raise IsolationUnavailable(
            f"the seccomp filter is built for x86_64 only; this machine is {platform.machine()}"
        )
    prog = [
        _insn(_LD_W_ABS, 0, 0, 4),  # A = seccomp_data.arch
        _insn(_JEQ, 1, 0, AUDIT_ARCH_X86_64),
        _insn(_RET, 0, 0, RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, 0),  # A = seccomp_data.nr
        _insn(_JGE, 0, 1, X32_SYSCALL_BIT),  # the x32 ABI would bypass the numbers below
        _insn(_RET, 0, 0, _errno(errno.EPERM)),
    ]
    for nr in DENIED.values():
        prog += [_insn(_JEQ, 0, 1, nr), _insn(_RET, 0, 0, _errno(errno.EPERM))]
    # clone3 passes its flags in memory BPF cannot read: refuse it, libc falls back to clone.
    prog += [_insn(_JEQ, 0, 1, CLONE3), _insn(_RET, 0, 0, _errno(errno.ENOSYS))]
    # clone is fine (threads, fork) unless it asks for a new namespace.
    prog += [
        _insn(_JEQ, 0, 3, CLONE),
        _insn(_LD_W_ABS, 0, 0, 16),  # low 32 bits of args[0] (little endian): the flags
        _insn(_JSET, 0, 1, CLONE_NAMESPACE_FLAGS),
        _insn(_RET, 0, 0, _errno(errno.EPERM)),
        _insn(_RET, 0, 0, RET_ALLOW),
    ]
    return b"".join(prog)


def filter_fd(program: bytes) -> int:
    """A fresh readable descriptor holding the program (bwrap reads it to the end)."""
    fd = os.memfd_create("sandbank-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

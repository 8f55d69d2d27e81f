"""The seccomp filter every sandboxed process runs under, built with libseccomp as raw BPF.

A deny list on top of namespaces, no capabilities and no-new-privs: the calls below either
reach kernel surface a sandbox never needs or would let it build a new sandbox of its own.
libseccomp resolves the names for the machine's own architecture (x86_64 and aarch64 alike),
kills a process calling through any other architecture, and on x86_64 refuses the x32 ABI.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform

from ...errors import IsolationUnavailable

DENIED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "ptrace",
    "process_vm_readv", "process_vm_writev", "kcmp", "bpf", "perf_event_open", "keyctl",
    "add_key", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "userfaultfd", "open_by_handle_at", "name_to_handle_at",
    "syslog", "lookup_dcookie", "quotactl", "iopl", "ioperm", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "vhangup", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
)  # fmt: skip
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NAMESPACE_FLAGS = (
    0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
    0x00000080,
)  # fmt: skip
X32_SYSCALL_BIT = 0x40000000

SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_FLTATR_ACT_BADARCH = 2
SCMP_CMP_MASKED_EQ = 7
NR_SCMP_ERROR = -1
ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _errno(code: int) -> int:
    return 0x00050000 | code


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise IsolationUnavailable(
            "libseccomp is not installed: `apt-get install libseccomp2`"
        ) from e
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp),
    ]  # fmt: skip
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def build_filter() -> bytes:
    """The filter as `struct sock_filter[]` bytes, the format `bwrap --seccomp FD` reads."""
    machine = platform.machine()
    if machine not in ARCHES:
        raise IsolationUnavailable(f"no seccomp filter is defined for {machine}")
    lib = _libseccomp()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise IsolationUnavailable("libseccomp could not create a filter")
    try:
        # Any architecture but the machine's own (e.g. 32-bit x86 through int 0x80) is killed.
        _ok(lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS), "badarch")
        deny = _errno(errno.EPERM)
        for name in DENIED:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr != NR_SCMP_ERROR:  # a call this architecture does not have needs no rule
                _ok(lib.seccomp_rule_add_array(ctx, deny, nr, 0, None), name)
        # clone3 passes its flags in memory BPF cannot read: refuse it, libc falls back to clone.
        clone3 = lib.seccomp_syscall_resolve_name(b"clone3")
        _ok(lib.seccomp_rule_add_array(ctx, _errno(errno.ENOSYS), clone3, 0, None), "clone3")
        # clone is fine (threads, fork) unless it asks for a new namespace: one rule per flag.
        clone = lib.seccomp_syscall_resolve_name(b"clone")
        for flag in CLONE_NAMESPACE_FLAGS:
            cmp = _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag)
            _ok(lib.seccomp_rule_add_array(ctx, deny, clone, 1, ctypes.byref(cmp)), "clone")
        fd = os.memfd_create("sandbank-seccomp-build", 0)
        try:
            _ok(lib.seccomp_export_bpf(ctx, fd), "export")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            program = b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    if machine == "x86_64" and X32_SYSCALL_BIT.to_bytes(4, "little") not in program:
        raise IsolationUnavailable("the seccomp filter does not refuse the x32 ABI")
    return program


def _ok(ret: int, what: str) -> None:
    if ret < 0:
        raise IsolationUnavailable(f"libseccomp failed ({what}): {os.strerror(-ret)}")

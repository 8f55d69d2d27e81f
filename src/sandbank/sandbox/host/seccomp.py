"""The seccomp filter every sandboxed process runs under, built with libseccomp as raw BPF.

A deny list on top of namespaces, no capabilities and no-new-privs: the calls below either
reach kernel surface a sandbox never needs or would let it build a new sandbox of its own.
Socket families are an allow list: namespaces do not cover every family (vsock reaches the
hypervisor and the host whatever the network namespace), so only the families a sandbox needs
are created, every other one is `EAFNOSUPPORT`. libseccomp resolves the names for the
machine's own architecture (x86_64 and aarch64 alike), kills a process calling through any
other architecture, and on x86_64 refuses the x32 ABI. SECURITY.md reviews the calls added to
Linux since this list was first written, and why each one left allowed is safe.
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
    # Added since Linux 5.6 (SECURITY.md, "System calls"): another process's descriptors or
    # memory, the mount API's newer doors, quotas, secret memory, page-cache probes, fanotify.
    "pidfd_getfd", "process_madvise", "process_mrelease", "quotactl_fd", "open_tree_attr",
    "statmount", "listmount", "memfd_secret", "cachestat", "fanotify_init",
)  # fmt: skip
# Since Linux 5.1 every new call has one number on every architecture (x86_64 and aarch64
# alike); libseccomp 2.5 knows the older ones by name, not all of these.
UNIFIED_NUMBERS = {
    "pidfd_getfd": 438, "process_madvise": 440, "quotactl_fd": 443, "memfd_secret": 447,
    "process_mrelease": 448, "cachestat": 451, "statmount": 457, "listmount": 458,
    "open_tree_attr": 467,
}  # fmt: skip
# The calls reviewed end with Linux 6.17's (file_setattr, 469): a later kernel's new calls are
# refused with ENOSYS, as an older kernel would, until they are reviewed and listed here.
LAST_REVIEWED = 469
UNREVIEWED = range(LAST_REVIEWED + 1, 512)
# The socket families a sandbox may create (socket, socketpair): unix sockets, and IP and
# netlink inside its own network namespace. Every other family is refused (EAFNOSUPPORT).
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
ALLOWED_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
SOCKET_CALLS = ("socket", "socketpair")
# The kernel reads the family as an `int`: only the low 32 bits of the argument count.
FAMILY_BITS = 32
SMALL_FAMILIES = 64  # families below this are refused one by one; above, by their high bits
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
            nr = UNIFIED_NUMBERS.get(name, NR_SCMP_ERROR) if nr == NR_SCMP_ERROR else nr
            if nr != NR_SCMP_ERROR:  # a call this architecture does not have needs no rule
                _ok(lib.seccomp_rule_add_array(ctx, deny, nr, 0, None), name)
        for nr in UNREVIEWED:
            _ok(lib.seccomp_rule_add_array(ctx, _errno(errno.ENOSYS), nr, 0, None), str(nr))
        # clone3 passes its flags in memory BPF cannot read: refuse it, libc falls back to clone.
        clone3 = lib.seccomp_syscall_resolve_name(b"clone3")
        _ok(lib.seccomp_rule_add_array(ctx, _errno(errno.ENOSYS), clone3, 0, None), "clone3")
        # clone is fine (threads, fork) unless it asks for a new namespace: one rule per flag.
        clone = lib.seccomp_syscall_resolve_name(b"clone")
        for flag in CLONE_NAMESPACE_FLAGS:
            cmp = _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag)
            _ok(lib.seccomp_rule_add_array(ctx, deny, clone, 1, ctypes.byref(cmp)), "clone")
        _refuse_other_families(lib, ctx)
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


def _refuse_other_families(lib: ctypes.CDLL, ctx: int) -> None:
    """socket() and socketpair() of any family but `ALLOWED_FAMILIES`: EAFNOSUPPORT.

    libseccomp's rules for one call are alternatives (any that matches refuses), and each
    compares the argument under a mask, so the complement of the allow list is spelt out: one
    rule per set bit from `SMALL_FAMILIES` up (every larger family, today's and tomorrow's),
    then one per refused family below it. Masking to 32 bits matches what the kernel reads, so
    garbage in the upper half of the register changes nothing.
    """
    refuse = _errno(errno.EAFNOSUPPORT)
    low32 = (1 << FAMILY_BITS) - 1
    rules = [(1 << bit, 1 << bit) for bit in range(SMALL_FAMILIES.bit_length() - 1, FAMILY_BITS)]
    rules += [(low32, f) for f in range(SMALL_FAMILIES) if f not in ALLOWED_FAMILIES]
    for name in SOCKET_CALLS:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr == NR_SCMP_ERROR:
            raise IsolationUnavailable(f"libseccomp does not know {name} on this architecture")
        for mask, value in rules:
            cmp = _ArgCmp(0, SCMP_CMP_MASKED_EQ, mask, value)
            _ok(lib.seccomp_rule_add_array(ctx, refuse, nr, 1, ctypes.byref(cmp)), name)


def _ok(ret: int, what: str) -> None:
    if ret < 0:
        raise IsolationUnavailable(f"libseccomp failed ({what}): {os.strerror(-ret)}")

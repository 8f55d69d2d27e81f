"""The fork template: imports the data stack once, then forks each sandbox, which isolates itself.

Started by the server as root, single-threaded, in a mount namespace of its own where the
runtime and this directory sit at the paths sandboxes see them (so module paths stay valid in
the children). It speaks on one SOCK_SEQPACKET socket: a boot message, then one order per
sandbox carrying the sandbox's pipes as descriptors; it answers each with the child's host pid
and a pidfd for it.

Each order makes two processes, where bwrap has three:
- the *init*, forked here as PID 1 of a new PID namespace: closes every descriptor but its own,
  joins the session's cgroups before it copies a page (so copies are charged to the session),
  enters the host's mount namespace (the template's own hides the workspaces mounted after it
  started), unshares mount, network, IPC, UTS and cgroup namespaces, builds the root (tmpfs,
  read-only binds, /proc, /dev, /tmp, the workspace), pivots into it, drops every privilege,
  installs the seccomp filter, forks the worker, then becomes `sb-init` (runtime/sb-init.c),
  which reaps every orphan and reports the worker's exit status on a status pipe;
- the *worker*: resets what it inherited from the template (random generators, signals,
  environment) and runs `worker.main()` on its pipes.

Standard library only; it imports nothing from the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import importlib
import json
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Any

# Fixed descriptor layout in the init: the pipes the server sent, in this order.
FD_IN, FD_OUT, FD_ERR, FD_INTERRUPT, FD_STATUS, FD_GO, FD_HOSTNS = 0, 1, 2, 3, 4, 5, 6
N_ORDER_FDS = 6

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_DUMPABLE, PR_SET_NAME, PR_SET_SECCOMP, PR_CAPBSET_DROP = 4, 15, 22, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SECCOMP_MODE_FILTER = 2
MADV_COLLAPSE, HUGE_PAGE = 25, 2 << 20
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
_libc.syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(op: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> None:
    _check(_libc.prctl(op, a, b, c, d), f"prctl({op})")


def _enc(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(_libc.mount(_enc(src), _enc(target), _enc(fstype), flags, _enc(data or None)), target)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


# --- the root of a sandbox ------------------------------------------------------------------


def _bind(src: str, root: str, dst: str, *, ro: bool = True) -> None:
    target = root + dst
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()  # a mount point
    mount(src, target, None, MS_BIND | MS_REC)
    if ro:
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_root(order: dict[str, Any]) -> None:
    """The view bwrap gives: read-only /usr, a few /etc files, runtime, workspace, /tmp, /proc."""
    root = order["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    mount("sandbank", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    _bind("/usr", root, "/usr")
    for link in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{link}"):
            os.symlink(f"usr/{link}", f"{root}/{link}")
    for item in order["etc_binds"]:
        if os.path.exists(f"/etc/{item}"):
            _bind(f"/etc/{item}", root, f"/etc/{item}")
    os.makedirs(f"{root}/etc", exist_ok=True)
    for name, text in order["etc_files"].items():
        with open(f"{root}/etc/{name}", "w") as f:
            f.write(text)
        os.chmod(f"{root}/etc/{name}", 0o644)
    _bind(order["runtime"], root, order["runtime_mount"])
    _bind(order["inside"], root, order["inside_mount"])
    _bind(order["workspace"], root, "/workspace", ro=False)
    for src, dst in order.get("ro_binds", ()):  # the egress proxy's socket directory
        _bind(src, root, dst)
    os.makedirs(f"{root}/tmp")
    mount(
        "tmpfs",
        f"{root}/tmp",
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"mode=1777,size={order['tmp_bytes']}",
    )
    os.makedirs(f"{root}/proc")
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for sub in ("sys", "sysrq-trigger", "irq", "bus"):  # as bwrap: the kernel's knobs read-only
        path = f"{root}/proc/{sub}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _build_dev(root, order["tmp_bytes"])
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_dev(root: str, size: int) -> None:
    dev = f"{root}/dev"
    os.makedirs(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, f"mode=0755,size={size}")
    for name in DEVICES:
        open(f"{dev}/{name}", "a").close()  # a mount point
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")
    os.symlink("/proc/self/fd", f"{dev}/fd")
    os.symlink("pts/ptmx", f"{dev}/ptmx")
    os.mkdir(f"{dev}/shm")
    os.chmod(f"{dev}/shm", 0o1777)  # noqa: S103 - sticky and shared, as on any machine
    os.mkdir(f"{dev}/pts")
    with contextlib.suppress(OSError):  # without it: no pseudo-terminals, nothing worse
        mount(
            "devpts",
            f"{dev}/pts",
            "devpts",
            MS_NOSUID | MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=620",
        )


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))
        flags = struct.unpack("16sH22x", ifr)[1] | IFF_UP
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags))


# --- privileges ------------------------------------------------------------------------------


def drop_privileges(order: dict[str, Any], boot: dict[str, Any], *, seccomp: bool) -> None:
    """Become the sandbox uid with no capability left anywhere, no new privileges, seccomp."""
    uid = int(order["uid"])
    n = int(order["open_files"])
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    for cap in range(int(boot["cap_last_cap"]) + 1):
        prctl(PR_CAPBSET_DROP, cap)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()  # all zero: effective, permitted and inheritable emptied
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    prctl(PR_SET_DUMPABLE, 1)  # own /proc entries, as after an exec (the credentials changed)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if seccomp:
        program = bytes.fromhex(boot["seccomp"])
        buf = ctypes.create_string_buffer(program, len(program))
        fprog = _Fprog(len(program) // 8, ctypes.addressof(buf))
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


# --- the three processes of a sandbox -------------------------------------------------------


def init(order: dict[str, Any], boot: dict[str, Any], fds: list[int], hostns: int) -> None:
    """PID 1 of a new PID namespace, freshly forked from the template; never returns.

    Isolates itself (cgroups, namespaces, root, privileges, seccomp), runs the worker as its
    child, reaps every orphan, and reports the worker's exit status on the status pipe.
    """
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # The order's pipes take 0..5 and the host namespace 6; everything else is closed.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (*fds, hostns)]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(FD_HOSTNS + 1, os.sysconf("SC_OPEN_MAX"))
    os.umask(0o022)
    for procs in order["cgroup_procs"]:  # first: every page copied from now on is the session's
        with open(procs, "w") as f:
            f.write("0")  # this process
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")  # the memory limit's victim is the worker, not its init
    workspace_mounted()  # before entering the host's mount namespace, which then copies it
    # The template's own mount namespace hides workspaces mounted after it started.
    _check(_libc.setns(FD_HOSTNS, CLONE_NEWNS), "setns")
    os.close(FD_HOSTNS)
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    _check(_libc.unshare(flags), "unshare")
    build_root(order)
    socket.sethostname("sandbox")
    loopback_up()
    drop_privileges(order, boot, seccomp=True)
    worker_pid = os.fork()
    if worker_pid == 0:
        _run(run_worker, order, boot)
    set_name(b"sb-init")
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (FD_IN, FD_OUT, FD_INTERRUPT):
        os.dup2(devnull, fd)
    os.close(devnull)
    # The init's work is a wait loop: the small static program does it without holding the
    # template's copied Python heap (~2 MiB a sandbox). Without it, the same loop in Python.
    with contextlib.suppress(OSError):
        os.execv(order["init"], ["sb-init", str(worker_pid)])  # noqa: S606 - our own program
    while True:
        pid, status = os.wait()
        if pid == worker_pid:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code  # as bwrap reports a signal
            with contextlib.suppress(OSError):
                os.write(FD_STATUS, struct.pack(">i", code))
            os._exit(code)


def workspace_mounted() -> None:
    """Wait for the server's word that the workspace disk is mounted (it is made meanwhile)."""
    word = os.read(FD_GO, 1)
    os.close(FD_GO)
    if word != b"g":
        raise SystemExit("the workspace disk was not made")


def run_worker(order: dict[str, Any], boot: dict[str, Any]) -> None:
    os.setsid()
    set_name(b"python3")  # what bwrap's worker is called
    os.close(FD_STATUS)
    reset_inherited_state(order["env"])
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
    if os.environ.get("SANDBANK_PREIMPORT") == "1":
        # A pooled sandbox: walk the first steps of most sessions (a frame made, printed and
        # summed) now, so the pages they write are copied before the lease, not during the
        # client's first call. Only those: each path walked here is copied into every pooled
        # sandbox, used or not (bench/fork.py, pooled PSS: ~11 MiB with this walk; ~16 MiB
        # with a groupby and a describe too, ~14 with a read_csv; a chart copies ~10 MiB).
        os.environ["SANDBANK_PREIMPORT"] = "0"
        with contextlib.suppress(Exception):
            pd = importlib.import_module("pandas")
            df = pd.DataFrame({"a": [1, 2]})
            repr(df), repr(df.sum())
    worker: Any = importlib.import_module("sandbank_inside.worker")
    worker.main()
    os._exit(0)


def reset_inherited_state(env: dict[str, str]) -> None:
    """What a fork shares with its template and its siblings, made this process's own."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            continue
    # As a fresh interpreter: SIGINT raises KeyboardInterrupt, SIGPIPE and SIGXFSZ are ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.environ.clear()
    os.environ.update(env)
    reseed()
    mpl = sys.modules.get("matplotlib")
    if mpl is not None:
        # Cached while the template ran on the host's paths; recomputed from the new env.
        for name in ("get_cachedir", "get_configdir"):
            getattr(getattr(mpl, name, None), "cache_clear", lambda: None)()
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            plt.close("all")


def reseed() -> None:
    """Every generator seeded at import gets fresh entropy: siblings never share a stream."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()  # the legacy global RandomState: numpy does not reseed after fork
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None  # type: ignore[attr-defined]
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)


def _run(fn: Any, *args: Any) -> None:
    """Run `fn` in a fresh child; any failure is reported on its stderr and ends it."""
    try:
        fn(*args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


def set_name(name: bytes) -> None:
    """The process's name in `ps` (prctl copies it from the buffer)."""
    buf = ctypes.create_string_buffer(name)
    prctl(PR_SET_NAME, ctypes.addressof(buf))


# --- the template's own loop ----------------------------------------------------------------


def preload(modules: list[str]) -> list[str]:
    """Import the data stack and the named extras; return what failed to import."""
    worker: Any = importlib.import_module("sandbank_inside.worker")

    failed = []
    try:
        worker.preimport()
    except Exception:
        traceback.print_exc()
        failed.append("data stack")
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:
            failed.append(f"{name}: {e!r}")
    try:
        importlib.import_module("sandbank_inside.notebook").prepare()  # the session's shell
    except Exception as e:
        failed.append(f"the Python shell: {e!r}")
    importlib.import_module("sandbank_inside.editor")  # the worker imports it
    with contextlib.suppress(ImportError):
        importlib.import_module("sandbank_plotly")  # and this, at its start

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")
    release_files()
    return failed


def release_files() -> None:
    """Close what imports left open: a child must never find an object bound to a descriptor.

    Its descriptors are renumbered (its pipes take 0..5), so an object of the template holding
    fd 3 or 4 (matplotlib keeps its fonts open) would read the sandbox's interrupt pipe.
    """
    fm = sys.modules.get("matplotlib.font_manager")
    if fm is not None:
        fm._get_font.cache_clear()  # each child opens the fonts it uses, ~ms
    gc.collect()


def collapse_heap() -> int:
    """Back the template's anonymous memory with huge pages where the kernel can (bytes done).

    A fork copies the page tables of private memory; 2 MiB pages have no last level to copy,
    so each fork is faster and each sandbox holds less. A child writing to one copies 4 KiB
    of it, as before. Needs MADV_COLLAPSE (Linux 6.1); without it nothing changes.
    """
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open("/proc/self/maps") as f:
        for row in f:
            fields = row.split()
            anonymous = fields[4] == "0" and (len(fields) == 5 or fields[5] == "[heap]")
            if fields[1] != "rw-p" or not anonymous:
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            lo, hi = (lo + HUGE_PAGE - 1) & -HUGE_PAGE, hi & -HUGE_PAGE
            if hi > lo:
                _libc.madvise(lo, hi - lo, MADV_COLLAPSE)  # best effort, range by range
    with open("/proc/self/smaps_rollup") as f:
        for row in f:
            if row.startswith("AnonHugePages:"):
                return int(row.split()[1]) * 1024
    return 0


def open_files() -> list[str]:
    """What the template holds besides its sockets, pipes, namespaces and /dev/null."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target != "/dev/null" and not target.startswith(
                ("pipe:", "socket:", "mnt:", "pid:")
            ):
                found.append(f"{fd} {target}")
    return found


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(sock: socket.socket, boot: dict[str, Any], hostns: int) -> None:
    pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # poll, not select: a template started by a busy server gets its socket at a number past
    # select's 1024 (the server's descriptor, kept by pass_fds).
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll(5000)}
        if wake_r in ready:
            os.read(wake_r, 4096)
        reap()
        if sock.fileno() not in ready:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, N_ORDER_FDS)
        if not msg:
            break
        try:
            order = json.loads(msg)
            if len(fds) != N_ORDER_FDS:
                raise ValueError(f"an order needs {N_ORDER_FDS} descriptors, got {len(fds)}")
            # The child is PID 1 of a new PID namespace; later children are not.
            _check(_libc.unshare(CLONE_NEWPID), "unshare")
            try:
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _run(init, order, boot, fds, hostns)
            finally:
                _check(_libc.setns(pidns, CLONE_NEWPID), "setns back")
            # A pidfd, opened before this loop can reap the child: the server's handle can
            # never signal a recycled pid.
            pidfd = os.pidfd_open(pid)
        except Exception as e:
            sock.send(json.dumps({"error": repr(e)}).encode())
            continue
        finally:
            for fd in fds:
                os.close(fd)
        socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        os.close(pidfd)
    # Retired (the server closed the socket): leave once every sandbox forked here has ended.
    sock.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    hostns = int(sys.argv[2])
    os.set_inheritable(hostns, False)
    boot: dict[str, Any] = json.loads(sock.recv(1 << 20))
    set_name(b"sb-template")
    sys.argv = [""]
    failed = preload(list(boot.get("modules", [])))
    gc.collect()
    gc.freeze()  # the collector never touches these objects again: their pages stay shared
    huge = collapse_heap()
    threads = len(os.listdir("/proc/self/task"))
    failed += [f"left open: {f}" for f in open_files()]
    hello = {"ready": True, "pid": os.getpid(), "threads": threads, "failed": failed}
    sock.send(json.dumps({**hello, "huge_mib": huge >> 20}).encode())
    serve(sock, boot, hostns)


if __name__ == "__main__":
    main()

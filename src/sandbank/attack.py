"""`sandbank doctor --attack`: the project's own battery of escape attempts, run in real sandboxes.

Each attempt is a program run as a session's Python call; it prints `ESCAPED: what` when it
achieved what a sandbox must prevent, anything else when it was held. The host side gives it
targets that only an escape reaches: a secret file on the host, another session's workspace
file (by its host path), this process (to signal, trace or read), a TCP listener on the host's
loopback, and the host kernel's release (a kernel interface that answers is an escape only when
it is the host's kernel answering: gVisor's own kernel answering is what gVisor is for).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .config import Settings
from .errors import SandbankError
from .protocol.calls import PythonCall

TENANT = "doctor-attack"
ATTEMPT_TIMEOUT = 30.0

# What every attempt starts with: a syscall helper and whether the host's kernel answers.
PRELUDE = """
import ctypes, errno, os, socket, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def sc(nr, *args):
    ctypes.set_errno(0)
    return libc.syscall(nr, *[ctypes.c_long(a) for a in args])
HOST_KERNEL = os.uname().release == {host_release!r}
def kernel(name, ok):
    if ok and HOST_KERNEL:
        print("ESCAPED: " + name + " reached the host's kernel")
    else:
        print("held: " + name + (" (answered by the sandbox's own kernel)" if ok else ""))
"""

ATTEMPTS: dict[str, str] = {
    "read /etc/shadow": """
try:
    print("ESCAPED: " + open('/etc/shadow').read()[:20])
except OSError as e:
    print("held", e)
""",
    "read a host file": """
try:
    print("ESCAPED: " + open({secret_path!r}).read())
except OSError as e:
    print("held", e)
""",
    "write a host file": """
try:
    open({host_dir!r} + '/planted', 'w').write('x'); print("ESCAPED: planted a file")
except OSError as e:
    print("held", e)
""",
    "write into /usr": """
path = '/usr/lib/.sandbank-attack-' + str(os.getpid())
try:
    open(path, 'w').close(); os.unlink(path); print("ESCAPED: wrote " + path)
except OSError as e:
    print("held", e)
""",
    "read another session's workspace": """
try:
    print("ESCAPED: " + open({victim_path!r}).read())
except OSError as e:
    print("held", e)
""",
    "see the server's process": """
try:
    cmd = open('/proc/{server_pid}/cmdline', 'rb').read()
    print("ESCAPED: /proc of the host" if cmd == {server_cmdline!r} else "held (another process)")
except OSError as e:
    print("held", e)
""",
    "signal the server": """
try:
    os.kill({server_pid}, 0)
    cmd = open('/proc/{server_pid}/cmdline', 'rb').read()
    print("ESCAPED: can signal the server" if cmd == {server_cmdline!r} else "held (another)")
except OSError as e:
    print("held", e)
""",
    "ptrace the server": """
# PTRACE_SEIZE stops nothing, but a running tracee cannot be detached: a tracer that lives on
# freezes the server at its next signal (a tracee stops on every one). So a child seizes and
# exits at once, and its exit detaches.
child = os.fork()
if child == 0:
    r = sc(101, 0x4206, {server_pid}, 0, 0)  # PTRACE_SEIZE
    os._exit(0 if r == 0 else min(ctypes.get_errno(), 250) or 250)
status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
if status == 0:
    print("ESCAPED: traced the server")
else:
    print("held", errno.errorcode.get(status, status))
""",
    "connect to the host's loopback": """
s = socket.socket(); s.settimeout(3)
try:
    s.connect(('127.0.0.1', {port})); data = s.recv(64)
    print("ESCAPED: " + data.decode() if data == {greeting!r} else "held (another listener)")
except OSError as e:
    print("held", e)
""",
    "AF_VSOCK socket": """
try:
    socket.socket(40, socket.SOCK_STREAM).close(); kernel("AF_VSOCK", True)
except OSError as e:
    print("held", e)
""",
    "packet socket": """
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close(); kernel("AF_PACKET", True)
except OSError as e:
    print("held", e)
""",
    "keyctl": """
key = libc.syscall(248, b"user", b"sandbank-attack", b"x", ctypes.c_long(1), ctypes.c_long(-3))
kernel("add_key", key >= 0)
""",
    "bpf": """
attr = (ctypes.c_uint32 * 8)(2, 4, 4, 1, 0, 0, 0, 0)  # BPF_MAP_TYPE_ARRAY, 1 entry
kernel("bpf", libc.syscall(321, 0, ctypes.byref(attr), ctypes.sizeof(attr)) >= 0)
""",
    "perf_event_open": """
attr = (ctypes.c_uint32 * 32)(1, 128, 0)  # PERF_TYPE_SOFTWARE, size 128, CPU clock
kernel("perf_event_open", libc.syscall(298, ctypes.byref(attr), 0, -1, -1, 0) >= 0)
""",
    "mount": """
os.makedirs('attack-mount', exist_ok=True)
ok = libc.mount(b"none", b"attack-mount", b"tmpfs", 0, None) == 0
if ok:
    libc.umount2(b"attack-mount", 2)
os.rmdir('attack-mount')
kernel("mount", ok)
""",
    "unshare a user namespace": """
code = "import ctypes; print(ctypes.CDLL(None).unshare(0x10000000))"
out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout
kernel("unshare(CLONE_NEWUSER)", out.strip() == "0")
""",
    "setns into PID 1's mounts": """
try:
    fd = os.open('/proc/1/ns/mnt', os.O_RDONLY)
    kernel("setns", libc.setns(fd, 0) == 0)
except OSError as e:
    print("held", e)
""",
    "become root": """
try:
    os.setuid(0); print("ESCAPED: uid 0" if os.getuid() == 0 else "held")
except OSError as e:
    print("held", e)
""",
    "hold capabilities": """
eff = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]
print("ESCAPED: CapEff " + eff if int(eff, 16) else "held: no capabilities")
""",
    "fork bomb": """
pids = []
deadline = time.monotonic() + 10
try:
    while len(pids) < {fork_target} and time.monotonic() < deadline:
        pid = os.fork()
        if pid == 0:
            time.sleep(5); os._exit(0)
        pids.append(pid)
except OSError as e:
    pass
n = len(pids)
for p in pids:
    os.kill(p, 9); os.waitpid(p, 0)
print("ESCAPED: " + str(n) + " processes" if n >= {fork_target} else "held at " + str(n))
""",
    "exhaust memory": """
chunks = []
try:
    for _ in range({memory_target_mib} // 64):
        chunks.append(bytearray(64 << 20))
    print("ESCAPED: allocated {memory_target_mib} MiB")
except MemoryError:
    print("held: MemoryError")
""",
}


@dataclass(frozen=True)
class Outcome:
    isolation: str
    name: str
    escaped: bool
    detail: str


@contextlib.contextmanager
def _listener(greeting: bytes) -> Iterator[int]:
    """A TCP server on the host's loopback that greets whoever connects."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                with conn:
                    conn.sendall(greeting)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


async def attack(settings: Settings, out: TextIO) -> list[Outcome]:
    """Run the battery in a real sandbox of `settings.isolation`, in a scratch data dir."""
    from .sandbox.local import LocalSandboxes

    scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="sandbank-attack-"))
    os.chmod(scratch, 0o711)  # noqa: S103 - sandbox uids traverse it to their workspaces
    host_dir = scratch / "host"
    host_dir.mkdir(mode=0o777)
    os.chmod(host_dir, 0o777)  # noqa: S103 - an escape must not be stopped by mere modes
    secret = host_dir / "secret"
    secret.write_text("host-secret-" + secrets.token_hex(4))
    secret.chmod(0o644)
    greeting = b"host-listener-" + secrets.token_hex(4).encode()
    own = settings.model_copy(
        update={"data_dir": scratch / "data", "pool_size": 0, "pool_size_max": 0}
    )
    runtime = LocalSandboxes(own)
    outcomes: list[Outcome] = []
    try:
        await runtime.start()
        victim = await runtime.create(TENANT)
        victim_sb = runtime.session(victim.id, TENANT).sandbox
        victim_file = victim_sb.workspace / "victim-secret"
        victim_file.write_text("victim-" + secrets.token_hex(4))
        victim_file.chmod(0o644)
        attacker = await runtime.create(TENANT)
        with _listener(greeting) as port:
            values = {
                "host_release": os.uname().release,
                "secret_path": str(secret),
                "host_dir": str(host_dir),
                "victim_path": str(victim_file),
                "server_pid": os.getpid(),
                "server_cmdline": _own_cmdline(),
                "port": port,
                "greeting": greeting,
                "fork_target": settings.pids_limit * 2,
                "memory_target_mib": settings.memory_limit_mb * 2,
            }
            for name, body in ATTEMPTS.items():
                code = (PRELUDE + body).format(**values)
                call = PythonCall(code)
                try:
                    result = await runtime.execute(attacker.id, TENANT, call, ATTEMPT_TIMEOUT)
                    text = (result.stdout.strip() or result.stderr.strip()).splitlines()
                    detail = text[-1] if text else f"return code {result.return_code}"
                except SandbankError as e:
                    detail = f"held: {e.message}"
                if (tracer := _tracer()) != 0:
                    # Traced, this process would stop at its next signal with nobody to resume
                    # it: the tracer (a sandbox's process) goes, and the attempt counts.
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(tracer, signal.SIGKILL)
                    detail = f"ESCAPED: left this process traced by pid {tracer}"
                escaped = detail.startswith("ESCAPED") or (host_dir / "planted").exists()
                with contextlib.suppress(FileNotFoundError):
                    (host_dir / "planted").unlink()
                outcome = Outcome(settings.isolation, name, escaped, detail[:160])
                outcomes.append(outcome)
                mark = "ESCAPED" if escaped else "held"
                print(f"{settings.isolation:<7} {mark:<8} {name:<36} {outcome.detail}", file=out)
                out.flush()
    finally:
        with contextlib.suppress(SandbankError, OSError):
            await runtime.close()
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)
    return outcomes


def _tracer() -> int:
    """The pid tracing this process, 0 when none."""
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    return 0


def _own_cmdline() -> bytes:
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        return f.read()


def run_attack(settings: Settings, isolations: list[str], out: TextIO) -> int:
    """The battery against each isolation; a summary; 1 when any attempt succeeded."""
    total: list[Outcome] = []
    for isolation in isolations:
        total += asyncio.run(attack(_only(settings, isolation), out))
    for isolation in isolations:
        mine = [o for o in total if o.isolation == isolation]
        escaped = sum(o.escaped for o in mine)
        print(f"{isolation}: {escaped} of {len(mine)} attempts succeeded", file=out)
    return 1 if any(o.escaped for o in total) else 0


def _only(settings: Settings, isolation: str) -> Settings:
    """The settings of a server offering `isolation` alone."""
    return settings.model_copy(
        update={"isolation": isolation, "isolation_choices": "", "tenant_isolation": ""}
    )

"""The fork template's supervisor: boots it, passes it orders, replaces it when it dies or ages.

One template process (`inside/template.py`) per server, started as root from the runtime's
Python in a mount namespace of its own, where the runtime and the inside/ code sit at the
paths sandboxes see (so every module path it imported stays valid in its children). It is
replaced, without failing a lease, when it dies, when the runtime image or the inside/ code
changes on disk, and after `max_forks` children or `max_age` seconds (a fresh address layout,
canary and str-hash secret: what children of one template share, SECURITY.md).
A replaced template keeps running until the last sandbox forked from it has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import IsolationUnavailable, SandboxError, SandboxUnavailable
from ..host import image

log = logging.getLogger(__name__)

BOOT_TIMEOUT = 120.0  # importing the data stack on a loaded machine
ORDER_TIMEOUT = 10.0
CHECK_INTERVAL = 1.0  # how often the runtime image is looked at for changes
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# Runs as root in a private mount namespace (`unshare --mount`): the runtime and the inside/
# code go where the sandboxes see them, then the runtime's Python becomes the template.
CACHE = "/opt/sandbank/cache"  # the template's writable caches (matplotlib's font list)
BOOT_SCRIPT = f"""
set -e
mount -t tmpfs -o size=8m,mode=755 sandbank /opt
mkdir -p "$(dirname "$1")" "$(dirname "$3")" {CACHE}
mkdir "$1" "$3"
mount --bind -o ro "$2" "$1"
mount --bind -o ro "$4" "$3"
unset PWD OLDPWD  # the children's /proc/1/environ is the template's
exec "$1/bin/python3" -s -m sandbank_inside.template "$5" "$6"
"""


class TemplateGone(SandboxUnavailable):
    """The template process died or stopped answering (a lease retried later gets a new one)."""


@dataclass
class TemplateConfig:
    runtime_dir: Path
    runtime_mount: str
    inside_dir: Path
    inside_mount: str
    env: dict[str, str]
    seccomp: bytes
    modules: list[str]
    max_forks: int
    max_age: float = 0.0  # seconds; 0: no limit


@dataclass(eq=False)
class _Process:
    proc: asyncio.subprocess.Process
    sock: socket.socket
    fingerprint: tuple[tuple[str, int], ...]
    generation: int
    runtime: Path  # the runtime image's mount, bound by the sandboxes it forks
    inside: Path  # the in-sandbox code's read-only mount, likewise
    forks: int = 0
    started: float = field(default_factory=time.monotonic)
    retired: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def dead(self) -> bool:
        return self.proc.returncode is not None

    def order(self, msg: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """Blocking: one order, its answer (pid, pidfd of the new sandbox's init)."""
        try:
            socket.send_fds(self.sock, [json.dumps(msg).encode()], fds)
            data, got, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
        except OSError as e:
            raise TemplateGone(f"the fork template is gone: {e!r}") from e
        if not data:
            raise TemplateGone("the fork template closed its socket")
        for fd in got:  # received descriptors are inheritable: no program we start gets one
            os.set_inheritable(fd, False)
        reply = json.loads(data)
        if "error" in reply or len(got) != 1:
            for fd in got:
                os.close(fd)
            raise SandboxError(f"the fork template refused an order: {reply.get('error')}")
        return int(reply["pid"]), got[0]


class Template:
    """What the fork backend asks for a sandbox; one per server."""

    def __init__(self, config: TemplateConfig) -> None:
        self.config = config
        self._current: _Process | None = None
        self._next: asyncio.Task[_Process] | None = None
        self._retiring: set[_Process] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._boot_lock = asyncio.Lock()
        self._generation = 0
        self._checked = 0.0
        self._stopped = False
        self._readings = MemoryReadings()

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._current = await self._boot()

    async def stop(self) -> None:
        """Retire every template and wait for them to leave (their sandboxes are gone by now)."""
        self._stopped = True
        if self._next is not None:
            self._next.cancel()
            with contextlib.suppress(BaseException):
                await self._next
        for p in [*self._retiring, *([self._current] if self._current else [])]:
            self._retire(p)
            try:
                await asyncio.wait_for(p.proc.wait(), 10.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.proc.kill()
                await p.proc.wait()
        self._current = None
        for task in list(self._tasks):
            task.cancel()

    async def fork(self, order: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """Fork a sandbox from the template; (pid, pidfd) of its init. Retries a dead one."""
        for attempt in range(3):
            proc = await self._usable()
            try:
                msg = {**order, "runtime": str(proc.runtime), "inside": str(proc.inside)}
                async with proc.lock:
                    if proc.retired:  # replaced while this order waited: the new one takes it
                        continue
                    result = await _uncancellable(asyncio.to_thread(proc.order, msg, fds))
                proc.forks += 1
                return result
            except TemplateGone:
                log.warning("the fork template stopped answering; starting a new one")
                self._retire(proc)
                if attempt == 2:
                    raise
        raise SandboxUnavailable("the fork templates were replaced under this order; retry")

    # --- replacing -------------------------------------------------------------------------
    async def _usable(self) -> _Process:
        if self._stopped:
            raise SandboxUnavailable("the fork template is stopped")
        cur = self._current
        if cur is None or cur.dead or cur.retired:
            async with self._boot_lock:  # one boot for every lease waiting on it
                if self._current is cur:
                    self._current = await (self._next or self._boot_next())
                    self._next = None
            assert self._current is not None
            return self._current
        if self._next is None and self._aged(cur):
            self._next = self._boot_next()
            self._next.add_done_callback(self._swap)
        return cur

    def _aged(self, cur: _Process) -> bool:
        cfg = self.config
        if cfg.max_forks and cur.forks >= cfg.max_forks:
            log.info("the fork template made %d sandboxes; starting a fresh one", cur.forks)
            return True
        now = time.monotonic()
        if cfg.max_age and now - cur.started >= cfg.max_age:
            log.info("the fork template is %.0f s old; starting a fresh one", now - cur.started)
            return True
        if now - self._checked < CHECK_INTERVAL:
            return False
        self._checked = now
        if self._fingerprint() != cur.fingerprint:
            log.info("the runtime image changed; starting a new fork template")
            return True
        return False

    def _boot_next(self) -> asyncio.Task[_Process]:
        task = asyncio.create_task(self._boot())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _swap(self, task: asyncio.Task[_Process]) -> None:
        if task is not self._next or task.cancelled():
            return
        self._next = None
        if task.exception() is not None:
            log.error("a new fork template failed to start: %s", task.exception())
            return
        old, self._current = self._current, task.result()
        if old is not None:
            self._retire(old)

    def _retire(self, p: _Process) -> None:
        """Close its socket: it leaves once the sandboxes forked from it have ended.

        The socket is closed under the process's lock, after any order in flight on it has its
        answer: closing it under a thread that is sending would fail that lease for nothing.
        """
        if not p.retired:
            p.retired = True

            async def close_when_idle() -> None:
                async with p.lock:
                    with contextlib.suppress(OSError):
                        p.sock.close()

            task = asyncio.ensure_future(close_when_idle())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if not p.dead:
            self._retiring.add(p)

    def _on_exit(self, p: _Process) -> None:
        self._retiring.discard(p)
        if not p.retired and not self._stopped:
            log.warning("the fork template exited (%s); a new one starts", p.proc.returncode)
            self._retire(p)
            if self._next is None:
                self._next = self._boot_next()
                self._next.add_done_callback(self._swap)

    # --- booting ---------------------------------------------------------------------------
    def _fingerprint(self) -> tuple[tuple[str, int], ...]:
        cfg = self.config
        paths = [cfg.runtime_dir, cfg.runtime_dir / "pyvenv.cfg", image.image_of(cfg.runtime_dir)]
        paths.append(cfg.inside_dir)
        paths += sorted(cfg.runtime_dir.glob("lib/python3*/site-packages"))
        paths += sorted(cfg.inside_dir.glob("*.py"))
        found = []
        for path in paths:
            with contextlib.suppress(OSError):
                found.append((str(path), path.stat().st_mtime_ns))
        return tuple(found)

    async def _boot(self) -> _Process:
        cfg = self.config
        fingerprint = self._fingerprint()
        runtime = await asyncio.to_thread(image.mounted_runtime, cfg.runtime_dir)
        inside = await asyncio.to_thread(
            lambda: image.mounted_inside(image.tree_files(cfg.inside_dir))
        )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        hostns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                "unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", BOOT_SCRIPT, "sb-template",
                cfg.runtime_mount, str(runtime), cfg.inside_mount, str(inside),
                str(theirs.fileno()), str(hostns),
                env={**cfg.env, "PATH": f"{cfg.env.get('PATH', '')}:{HOST_PATH}"},
                pass_fds=(theirs.fileno(), hostns),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                cwd="/",
                start_new_session=True,
            )  # fmt: skip
        finally:
            theirs.close()
            os.close(hostns)
        self._watch_stderr(proc)
        self._generation += 1
        p = _Process(proc, ours, fingerprint, self._generation, runtime, inside)
        try:
            boot = {
                "seccomp": cfg.seccomp.hex(),
                "modules": cfg.modules,
                "cap_last_cap": _cap_last_cap(),
            }
            await asyncio.to_thread(ours.sendall, json.dumps(boot).encode())
            ready = await asyncio.wait_for(asyncio.to_thread(ours.recv, 1 << 16), BOOT_TIMEOUT)
            if not ready:
                raise TemplateGone("the fork template exited while importing the data stack")
            hello = json.loads(ready)
        except BaseException as e:
            ours.close()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            if isinstance(e, (TimeoutError, TemplateGone, OSError)):
                raise IsolationUnavailable(f"the fork template failed to start: {e!r}") from e
            raise
        ours.settimeout(ORDER_TIMEOUT)  # a template that stops answering is replaced
        if hello.get("failed"):
            log.warning("the fork template's preload: %s", "; ".join(hello["failed"]))
        if hello.get("threads", 1) != 1:
            log.warning("the fork template runs %s threads; forks copy only one", hello["threads"])
        task = asyncio.create_task(self._wait_exit(p))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        mem = process_memory(proc.pid)
        log.info(
            "fork template %d ready in %.2f s (pid %d, PSS %.1f MiB, %s MiB in huge pages)",
            p.generation, time.monotonic() - t0, proc.pid, mem.get("pss", 0) / 2**20,
            hello.get("huge_mib", 0),
        )  # fmt: skip
        return p

    async def _wait_exit(self, p: _Process) -> None:
        await p.proc.wait()
        self._on_exit(p)

    def _watch_stderr(self, proc: asyncio.subprocess.Process) -> None:
        async def drain() -> None:
            assert proc.stderr is not None
            while line := await proc.stderr.readline():
                log.warning("fork template: %s", line.decode(errors="replace").rstrip())

        task = asyncio.create_task(drain())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- reporting -------------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """The templates' own memory (bytes), apart from the sessions' cgroups.

        Read from the kernel at most every `MEMORY_EVERY` seconds, off the event loop: walking a
        template's page tables (smaps_rollup) grows with the sessions forked from it, and a
        metrics scrape at a full machine spent most of its time there.
        """
        total = {"pss": 0, "rss": 0, "templates": 0}
        live = [p.proc.pid for p in [*self._retiring, self._current] if p and not p.dead]
        for mem in self._readings.of(live).values():
            total["pss"] += mem.get("pss", 0)
            total["rss"] += mem.get("rss", 0)
            total["templates"] += 1
        return total

    @property
    def pid(self) -> int | None:
        return self._current.proc.pid if self._current and not self._current.dead else None

    @property
    def generation(self) -> int:
        return self._current.generation if self._current else 0


async def _uncancellable(exchange: Coroutine[Any, Any, tuple[int, int]]) -> tuple[int, int]:
    """Finish an order even if the caller is cancelled, then let the cancellation through.

    The caller closes the descriptors it sent once we return: leaving while they are still
    being sent could send whatever file reused their numbers. It also keeps the socket's
    answers in step with its orders (the lock is held until the answer is read).
    """
    task = asyncio.ensure_future(exchange)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        os.close(result[1])  # nobody will use this sandbox: its pidfd goes, cgroups kill it
        raise asyncio.CancelledError
    return result


MEMORY_EVERY = 10.0  # seconds between two readings of the templates' memory


class MemoryReadings:
    """Processes' memory as last read: a new process is read at once, the others again in a
    thread once their reading is older than `every` seconds (the caller gets the last one)."""

    def __init__(
        self, every: float = MEMORY_EVERY, read: Callable[[int], dict[str, int]] | None = None
    ) -> None:
        self.every = every
        self._read = read or process_memory
        self._known: dict[int, dict[str, int]] = {}
        self._at = 0.0
        self._refreshing = False
        self._lock = threading.Lock()

    def of(self, pids: list[int]) -> dict[int, dict[str, int]]:
        with self._lock:
            self._known = {pid: mem for pid, mem in self._known.items() if pid in pids}
            new = [pid for pid in pids if pid not in self._known]
            stale = time.monotonic() - self._at >= self.every and not self._refreshing
            if stale:
                self._refreshing = True
        for pid in new:
            mem = self._read(pid)
            with self._lock:
                self._known[pid] = mem
        if stale:
            threading.Thread(target=self._refresh, args=(pids,), daemon=True).start()
        with self._lock:
            return {pid: self._known[pid] for pid in pids if pid in self._known}

    def _refresh(self, pids: list[int]) -> None:
        try:
            read = {pid: self._read(pid) for pid in pids}
            with self._lock:
                for pid, mem in read.items():
                    if pid in self._known:
                        self._known[pid] = mem
        finally:
            with self._lock:
                self._at = time.monotonic()
                self._refreshing = False


def process_memory(pid: int) -> dict[str, int]:
    """PSS and RSS of one process, in bytes (empty when it is gone)."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Pss", "Rss"):
                    found[key.lower()] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return found


def _cap_last_cap() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())

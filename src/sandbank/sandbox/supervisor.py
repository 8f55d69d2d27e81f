"""A sandbox run by a worker process: calls, deadlines, crashes and restarts, over a backend's box.

A backend (bwrap, fork, unisolated) hands in a `Box`: how to acquire its host resources,
launch a worker, kill everything and release; this module decides what a timeout, a crash or a
destroy looks like to the caller. Any restart happens after the answer, never while a client
waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from ..errors import SandboxError
from ..protocol.calls import (
    RC_KILLED,
    RC_TIMEOUT,
    BashCall,
    Display,
    ExecResult,
    OnEvent,
    Output,
    PythonCall,
    RestartReason,
    ToolCall,
)
from ..protocol.codec import decode_bundle, decode_cell_error, encode_edit, text
from ..protocol.filesystem import FsChange
from ..protocol.processes import ProcessEvent, ProcessInfo, ProcessSpec, Signal
from .background import Background
from .channel import WorkerBroken, WorkerGone, WorkerProcess
from .inside import protocol
from .limits import Limits

log = logging.getLogger(__name__)

HARD_GRACE = 1.0  # after a hard interrupt of the shell, before the whole worker is killed
READY_TIMEOUT = 60.0


def to_message(call: ToolCall) -> dict[str, Any]:
    if isinstance(call, PythonCall):
        msg: dict[str, Any] = {"op": protocol.OP_PYTHON, "code": call.code}
        if call.context is not None:
            msg[protocol.CONTEXT] = call.context
        if call.cwd is not None:
            msg[protocol.CWD] = call.cwd
        if call.envs:
            msg[protocol.ENVS] = dict(call.envs)
        if call.notebook:
            msg[protocol.NOTEBOOK] = True
        return msg
    if isinstance(call, BashCall):
        return {"op": protocol.OP_BASH, "command": call.command}
    return {"op": protocol.OP_EDIT, **encode_edit(call)}


class Box(Protocol):
    """What a backend provides for one sandbox: host resources and how its worker starts."""

    # The workspace root's (uid, gid, mode), given back before every start (None: leave it).
    root_policy: tuple[int, int, int] | None

    @property
    def uid(self) -> int:
        """Who owns the workspace's files (0: the server's own user)."""
        ...

    @property
    def workspace(self) -> Path:
        """The workspace as the server reaches it, for its own file operations."""
        ...

    async def acquire(self) -> None:
        """Claim host resources (uid, cgroups, disk); a cancelled claim leaves nothing."""
        ...

    async def launch(self) -> WorkerProcess:
        """Start a worker on the sandbox's resources."""
        ...

    async def kill_everything(self, worker: WorkerProcess | None) -> None:
        """Kill every process of the sandbox, `worker` included."""
        ...

    async def release(self) -> None:
        """Free host resources; called once, after every process is dead."""
        ...

    def oom_count(self) -> int:
        """Memory-limit kills so far (0 where nothing counts them)."""
        ...

    async def keep_disk(self, dest: Path) -> None:
        """Once every process is dead: unmount the workspace and keep its disk at `dest`."""
        ...

    async def freeze_copy(self, dest: Path) -> None:
        """A consistent copy of the workspace's disk at `dest`, its processes left running."""
        ...


class SupervisedSandbox:
    """A sandbox run by a worker process: calls, deadlines, crashes and restarts."""

    def __init__(self, sandbox_id: str, box: Box, limits: Limits) -> None:
        self.id = sandbox_id
        self.box = box
        self.limits = limits
        self._worker: WorkerProcess | None = None
        self._restart: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self.background: Background | None = None  # the worker's processes and watches
        self.restarts = 0
        self.on_restart: Callable[[RestartReason], None] | None = None  # the runtime's hook
        # Memory-limit kills counted when the worker started (or after a call had something
        # killed): a worker's death past it is the memory limit's. Read once per worker, not
        # per call (it is a file of the cgroup).
        self._ooms_seen = 0

    @property
    def uid(self) -> int:
        return self.box.uid

    @property
    def root_policy(self) -> tuple[int, int, int] | None:
        return self.box.root_policy

    @root_policy.setter
    def root_policy(self, policy: tuple[int, int, int] | None) -> None:
        # Restored before every start of a worker: sandboxed code may chmod the root away
        # (`chmod -R 644 .`), which would brick every restart.
        self.box.root_policy = policy

    @property
    def workspace(self) -> Path:
        return self.box.workspace

    def _death_cause(self, exit_status: int | None) -> tuple[str, int]:
        """Explain why the worker died: (message, return code)."""
        if exit_status is None:
            return "the interpreter stopped responding and was killed", RC_KILLED
        if exit_status < 0 or exit_status > 128:
            sig = -exit_status if exit_status < 0 else exit_status - 128
            names = {9: "SIGKILL", 11: "segmentation fault (SIGSEGV)", 6: "SIGABRT", 15: "SIGTERM"}
            return f"killed by {names.get(sig, f'signal {sig}')}", 128 + sig
        return f"the interpreter exited with code {exit_status}", exit_status

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self.box.acquire()
        try:
            self._worker = await self._start_worker()
        except BaseException:
            await self.close()
            raise

    async def _start_worker(self) -> WorkerProcess:
        if self.root_policy is not None:
            await asyncio.to_thread(restore_root, self.workspace, *self.root_policy)
        worker = await self.box.launch()
        try:
            hello = await asyncio.wait_for(worker.recv(), READY_TIMEOUT)
        except (TimeoutError, WorkerGone, SandboxError) as e:
            diag = worker.diagnostics()
            await worker.close()
            raise SandboxError(f"the sandbox failed to start: {diag or e!r}") from e
        except BaseException:  # cancelled: its client left
            await worker.close()
            raise
        if not hello.get(protocol.READY):
            await worker.close()
            raise SandboxError("the sandbox failed to start: no ready signal")
        self.background = Background(worker)
        worker.demux(self.background.dispatch)
        self._ooms_seen = self.box.oom_count()
        return worker

    def _schedule_restart(self, reason: RestartReason) -> None:
        if self._closed or (self._restart and not self._restart.done()):
            return
        old, self._worker = self._worker, None
        self._restart = asyncio.create_task(self._do_restart(old, reason))

    async def _do_restart(self, old: WorkerProcess | None, reason: RestartReason) -> None:
        self.restarts += 1
        if self.on_restart is not None:
            self.on_restart(reason)
        await self._retire(old)
        self._worker = await self._start_worker()

    async def _retire(self, worker: WorkerProcess | None) -> None:
        """Kill the sandbox's processes and release the old worker's pipes and pid."""
        await self.box.kill_everything(worker)
        if worker is not None:
            await worker.close()

    async def _ready_worker(self, deadline: float) -> WorkerProcess | None:
        """The worker, once a pending restart is done; None if that outlasts the deadline."""
        task = self._restart  # a restart, or the settling of a cancelled call
        if task is not None:
            try:
                # Shielded: the restart goes on for the next call even if this one gives up.
                await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return None
            finally:
                if task.done() and self._restart is task:
                    self._restart = None
        if self._worker is None:
            self._worker = await self._start_worker()
        return self._worker

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._restart is not None:
            self._restart.cancel()
        try:
            await self._retire(self._worker)
        finally:
            await self.box.release()

    @property
    def closed(self) -> bool:
        return self._closed

    # --- services beside calls: processes, watches, contexts ---------------------------------
    async def _services(self) -> Background:
        """The current worker's services, once a pending restart is done."""
        task = self._restart
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), READY_TIMEOUT)
        if self._closed or self.background is None:
            raise SandboxError("the session has ended")
        return self.background

    async def start_process(self, spec: ProcessSpec) -> AsyncIterator[ProcessEvent]:
        return await (await self._services()).start(spec)

    async def connect_process(self, pid: int) -> AsyncIterator[ProcessEvent]:
        return (await self._services()).connect(pid)

    async def list_processes(self) -> list[ProcessInfo]:
        return (await self._services()).listing()

    async def send_stdin(self, pid: int, data: bytes) -> None:
        await (await self._services()).write(pid, data)

    async def close_stdin(self, pid: int) -> None:
        await (await self._services()).close_stdin(pid)

    async def signal_process(self, pid: int, sig: Signal) -> None:
        await (await self._services()).signal(pid, sig)

    async def watch(self, path: str, recursive: bool) -> AsyncIterator[FsChange]:
        return await (await self._services()).watch(path, recursive)

    async def drop_context(self, context: str) -> None:
        """Forget a Python context's namespace (a call of its own, in order with the others)."""
        async with self._lock:
            if self._closed:
                return
            worker = await self._ready_worker(time.monotonic() + READY_TIMEOUT)
            if worker is None:
                return
            try:
                await worker.send({"op": protocol.OP_DROP_CONTEXT, protocol.CONTEXT: context})
                await asyncio.wait_for(_reply(worker), self.limits.grace + 5)
            except TimeoutError:
                self._schedule_restart("protocol")  # a late reply must not answer a later call
            except WorkerGone:
                pass  # the next call finds it dead and starts another: the context is gone too

    # --- pauses (durability.py decides; the worker writes and reads the state) --------------
    async def state_op(self, op: str, name: str, timeout: float) -> dict[str, str]:
        """Have the worker save its state to (or restore it from) the workspace file `name`;
        what could not be kept. `SandboxError` with the worker's reason when it failed."""
        async with self._lock:
            worker = await self._ready_worker(time.monotonic() + READY_TIMEOUT)
            if self._closed or worker is None:
                raise SandboxError("the session's interpreter is not running")
            try:
                await worker.send({"op": op, protocol.PATH: name})
                reply = await asyncio.wait_for(_reply(worker), timeout)
            except TimeoutError:
                self._schedule_restart("protocol")
                raise SandboxError("the interpreter did not answer in time") from None
            except WorkerGone:
                self._schedule_restart("crash")
                raise SandboxError("the interpreter died while saving its state") from None
        if not reply.get("ok"):
            raise SandboxError(str(reply.get("error") or "the interpreter refused"))
        lost = reply.get(protocol.LOST) or {}
        return {str(k): str(v) for k, v in lost.items()}

    def interrupt(self) -> None:
        """Interrupt the call running now, if any (a KeyboardInterrupt keeps the state)."""
        if self._lock.locked() and self._worker is not None:
            self._worker.interrupt()

    async def suspend(self, dest: Path) -> None:
        """End every process, keep the workspace's disk at `dest`, give back the rest."""
        async with self._lock:
            if self._closed:
                raise SandboxError("the session has ended")
            self._closed = True
            if self._restart is not None:
                self._restart.cancel()
            try:
                await self._retire(self._worker)
                self._worker = None
                await self.box.keep_disk(dest)
            finally:
                await self.box.release()

    async def checkpoint_disk(self, dest: Path) -> None:
        async with self._lock:
            await self.box.freeze_copy(dest)

    # --- calls -------------------------------------------------------------------------------
    async def execute(
        self, call: ToolCall, deadline: float, on_event: OnEvent | None = None
    ) -> ExecResult:
        started = time.monotonic()
        async with self._lock:
            if self._closed:
                return _result_of_destroyed(started)
            try:
                worker = await self._ready_worker(deadline)
            except SandboxError as e:
                return ExecResult(stderr=f"{e.message}\n", return_code=RC_KILLED)
            if worker is None:
                return ExecResult(
                    stderr="[sandbank] timed out waiting for the interpreter to restart after an "
                    "earlier failure; it is still starting, try again\n",
                    return_code=RC_TIMEOUT,
                    duration_ms=int((time.monotonic() - started) * 1000),
                )
            msg = to_message(call)
            msg[protocol.LIMIT] = self.limits.output_bytes
            if on_event is not None:
                msg[protocol.STREAM] = True
            reply = await self._exchange(worker, msg, deadline, call, on_event)
        reply.duration_ms = int((time.monotonic() - started) * 1000)
        return reply

    async def _exchange(
        self,
        worker: WorkerProcess,
        msg: dict[str, Any],
        deadline: float,
        call: ToolCall,
        on_event: OnEvent | None,
    ) -> ExecResult:
        timeout = max(0.0, deadline - time.monotonic())
        oom_before = self._ooms_seen
        try:
            await worker.send(msg)
            try:
                async with asyncio.timeout(timeout):  # in this task: no task of its own a call
                    reply = await _reply(worker, on_event)
                result = _parse(reply)
                if result.return_code > 128:
                    # Something of the call was killed (a subprocess past the memory limit,
                    # say): the count a later death is judged against moves on with it.
                    self._ooms_seen = self.box.oom_count()
                return result
            except TimeoutError:
                return await self._on_timeout(worker, call, deadline)
        except WorkerBroken as e:
            worker.kill()
            return await self._on_death(worker, oom_before, broken=str(e))
        except WorkerGone:
            return await self._on_death(worker, oom_before)
        except asyncio.CancelledError:
            # The caller gave up (a cancelled run): stop the code, and keep the channel in step
            # by consuming the reply before the next call may start.
            self._restart = asyncio.create_task(self._settle(worker))
            raise

    async def _settle(self, worker: WorkerProcess) -> None:
        worker.interrupt()
        try:
            await asyncio.wait_for(_reply(worker), self.limits.grace)
            return
        except (TimeoutError, WorkerGone):
            pass
        self._worker = None
        await self._do_restart(worker, "cancelled")

    async def _on_timeout(
        self, worker: WorkerProcess, call: ToolCall, deadline: float
    ) -> ExecResult:
        worker.interrupt()
        try:
            res = _parse(await asyncio.wait_for(_reply(worker), self.limits.grace))
            res.stderr += "\n[sandbank] timed out: interrupted; the session's state is kept\n"
            res.return_code = RC_TIMEOUT
            return res
        except (TimeoutError, WorkerGone):
            pass
        if isinstance(call, BashCall):
            # The shell ignored SIGINT: kill its command group, keep the Python interpreter.
            worker.interrupt(hard=True)
            try:
                res = _parse(await asyncio.wait_for(_reply(worker), HARD_GRACE))
                res.stderr += (
                    "\n[sandbank] timed out: the command ignored SIGINT and was "
                    "killed; the shell was restarted (its variables and directory are reset)\n"
                )
                res.return_code = RC_TIMEOUT
                return res
            except (TimeoutError, WorkerGone):
                pass
        self._schedule_restart("timeout")
        return ExecResult(
            stderr=(
                "[sandbank] timed out: the code did not stop when interrupted, so the "
                "interpreter was killed and restarted; its state (variables, imports) was lost. "
                "Files in the workspace are kept.\n"
            ),
            return_code=RC_TIMEOUT,
        )

    async def _on_death(
        self, worker: WorkerProcess, oom_before: int, broken: str | None = None
    ) -> ExecResult:
        if self._closed:
            return _result_of_destroyed(time.monotonic())
        status = await worker.wait(timeout=2.0)
        reason: RestartReason = "crash"
        if broken is not None:
            cause, rc = f"the interpreter broke the protocol ({broken}) and was killed", RC_KILLED
            reason = "protocol"
        elif self.box.oom_count() > oom_before:
            mib = self.limits.memory_bytes // (1024 * 1024)
            limit = f"{mib // 1024} GiB" if mib % 1024 == 0 else f"{mib} MiB"
            cause, rc = f"killed: memory limit of {limit} exceeded", RC_KILLED
            reason = "memory"
        else:
            cause, rc = self._death_cause(status)
        self._schedule_restart(reason)
        return ExecResult(
            stderr=(
                f"[sandbank] {cause}. The interpreter's state (variables, imports) was lost; "
                "the next call starts a fresh interpreter on the same workspace.\n"
            ),
            return_code=rc,
        )


async def _reply(worker: WorkerProcess, on_event: OnEvent | None = None) -> dict[str, Any]:
    """The call's reply, handing the event frames before it (a streamed call's) to `on_event`."""
    while True:
        msg = await worker.recv()
        kind = msg.get(protocol.EVENT)
        if kind is None:
            return msg
        if on_event is None or kind not in (
            protocol.EVENT_STDOUT, protocol.EVENT_STDERR, protocol.EVENT_DISPLAY,
        ):  # fmt: skip
            continue
        data = msg.get("data")
        if kind == protocol.EVENT_DISPLAY:
            if isinstance(data, dict):
                on_event(Display(decode_bundle(data)))
        elif isinstance(data, str):
            on_event(Output("stdout" if kind == protocol.EVENT_STDOUT else "stderr", text(data)))


def _parse(reply: dict[str, Any]) -> ExecResult:
    try:
        files = [text(f) for f in reply.get(protocol.FILES) or []]
        stderr = text(reply.get(protocol.STDERR) or "")
        cut = int(reply.get(protocol.FILES_CUT) or 0)
        if cut:
            stderr += f"\n[sandbank] {cut} more produced files are not listed\n"
        displays = [decode_bundle(b) for b in reply.get(protocol.DISPLAYS) or []]
        if dropped := int(reply.get(protocol.DISPLAYS_CUT) or 0):
            stderr += f"\n[sandbank] {dropped} display outputs were too large to send\n"
        main = reply.get(protocol.MAIN)
        error = reply.get(protocol.ERROR)
        return ExecResult(
            stdout=text(reply.get(protocol.STDOUT) or ""),
            stderr=stderr,
            return_code=int(reply.get(protocol.RETURN_CODE) or 0),
            files=files,
            displays=displays,
            main=decode_bundle(main) if main is not None else None,
            error=decode_cell_error(error),
        )
    except (TypeError, ValueError, AttributeError) as e:
        raise WorkerBroken("a malformed reply") from e


def restore_root(root: Path, uid: int, gid: int, mode: int) -> None:
    """Give the workspace root its owner and mode back, whatever sandboxed code did to it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


DESTROYED = "[sandbank] the session was destroyed while this call was running\n"


def _result_of_destroyed(started: float) -> ExecResult:
    return ExecResult(
        stderr=DESTROYED,
        return_code=RC_KILLED,
        duration_ms=int((time.monotonic() - started) * 1000),
    )

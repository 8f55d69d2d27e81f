"""The whole server in-process over fakes, driven by Starlette's TestClient: no root, no process.

`FakeApp` is `create_app` handed sandboxes on the fake backend (they run nothing: each call is
answered by `canned`, which knows a few programs the HTTP tests send, by their text), a model the
test scripts (`ScriptedModel`), and the default SQLite database and local object store in a
temporary directory (real, and fast). What is tested over it is the HTTP layer of both APIs:
shapes, status codes, auth, limits, framing, error bodies. Real execution is the root tier's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import uvicorn
from starlette.testclient import TestClient

from sandbank.agent.model import (
    ChatMessage,
    ModelReply,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from sandbank.agent.scripted import ScriptedModel, answer, run_python
from sandbank.app import create_app
from sandbank.config import Settings
from sandbank.http.auth import load_tokens
from sandbank.metrics import SandboxHooks
from sandbank.protocol.calls import BashCall, EditorCall, ExecResult, PythonCall, ToolCall
from sandbank.sandbox.backends.base import new_sandbox_id
from sandbank.sandbox.backends.fake import FakeBackend, FakeSandbox
from sandbank.sandbox.local import LocalSandboxes
from sandbank.serving import connection_book, listener_config
from sandbank.store import Store
from tests.support import free_port

BASE_URL = "http://localhost"  # a host of the default SANDBANK_ALLOWED_HOSTS
CLIENT = ("127.0.0.1", 50000)  # requests come from loopback, as in the real-server tests
T = TypeVar("T")

_PRINT = re.compile(r"print\((-?\d+|'[^'\\]*')\)")
_ECHO = re.compile(r"echo (\w+)")
_SLEEP = re.compile(r"time\.sleep\((\d+(?:\.\d+)?)\)")
_EXIT = re.compile(r"raise SystemExit\((\d+)\)")
_RAISE = re.compile(r"raise (\w+)\('([^']*)'\)")

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32  # the start of a PNG file, as a chart's would be
# What a program that printed more than `output_limit_bytes` gets (sandbox/inside's marker).
CUT = "\n[output truncated: {} more bytes not shown]\n"


async def canned(call: ToolCall, workspace: Path) -> ExecResult:
    """The fake's answer to the programs the HTTP tests send (never a real execution).

    `print(N)` and `print('text')` print, `echo WORD` echoes, bash that only makes
    directories, files, links and pipes makes them (`_plant`), `raise SystemExit(N)` exits N,
    `raise E('m')` fails with a traceback, `time.sleep(S)` sleeps (so deadlines and destroys
    cut it), `chart` and `page` write chart.png and page.html as the loopback fake LLM's
    programs do, the editor's `create` writes its file; anything else succeeds silently.
    """
    if isinstance(call, EditorCall):
        if call.command == "create" and call.file_text is not None:
            (workspace / call.path.removeprefix("/workspace/")).write_text(call.file_text)
        return ExecResult()
    text = call.code if isinstance(call, PythonCall) else call.command
    if text == "page":  # what PAGE_CODE does
        (workspace / "page.html").write_text("<h1>made by the agent</h1>")
        return ExecResult(stdout="wrote page.html\n", files=["page.html"])
    if text == "chart":  # what CHART_CODE does to data.csv, for the interpreter API's tests
        (workspace / "chart.png").write_bytes(PNG)
        return ExecResult(stdout="TOTAL 42\n", files=["chart.png"])
    if sleep := _SLEEP.search(text):
        await asyncio.sleep(float(sleep.group(1)))
    if isinstance(call, BashCall):
        if _plant(text, workspace):
            return ExecResult()
        echoed = _ECHO.fullmatch(text.strip())
        return ExecResult(stdout=f"{echoed.group(1)}\n" if echoed else "")
    if printed := _PRINT.fullmatch(text.strip()):
        return ExecResult(stdout=f"{printed.group(1).strip(chr(39))}\n")
    if exited := _EXIT.fullmatch(text.strip()):
        return ExecResult(return_code=int(exited.group(1)))
    if raised := _RAISE.fullmatch(text.strip()):
        name, message = raised.groups()
        trace = f'Traceback (most recent call last):\n  File "<cell>", line 1\n{name}: {message}\n'
        return ExecResult(stderr=trace, return_code=1)
    return ExecResult()


def _plant(command: str, workspace: Path) -> bool:
    """What bash would leave in the workspace for commands made only of `cd D`, `mkdir -p D`,
    `touch F...` (with `{1..N}`), `mkfifo F` and `ln -s TARGET NAME` joined by `;` or `&&`:
    the files, links and pipes a program plants for the server's file routes to meet.
    False (and nothing done) for any other command."""
    steps = [step.split() for step in re.split(r";|&&", command) if step.strip()]
    if not steps or any(step[0] not in _PLANTERS for step in steps):
        return False
    here = workspace
    for name, *args in steps:
        if name == "cd":
            here = here / args[0]
        elif name == "mkdir":
            (here / args[-1]).mkdir(parents=True, exist_ok=True)
        elif name == "mkfifo":
            os.mkfifo(here / args[0])
        elif name == "ln":
            (here / args[2]).symlink_to(args[1])
        else:
            for arg in args:
                if braces := _BRACES.fullmatch(arg):
                    prefix, first, last = braces.groups()
                    for i in range(int(first), int(last) + 1):
                        (here / f"{prefix}{i}").touch()
                else:
                    (here / arg).touch()
    return True


_PLANTERS = {"cd", "mkdir", "touch", "mkfifo", "ln"}
_BRACES = re.compile(r"(\w*)\{(\d+)\.\.(\d+)\}")

Answer = Callable[[ToolCall, Path], Awaitable[ExecResult]]


class CannedBackend(FakeBackend):
    """The fake backend, each sandbox answering with `answer(call, its workspace)`."""

    def __init__(self, settings: Settings, answer: Answer = canned) -> None:
        super().__init__(settings)
        self.answer = answer

    def new(self, preimport: bool) -> FakeSandbox:
        sandbox_id = new_sandbox_id()
        workspace = self.base_dir / sandbox_id / "ws"

        def handler(call: ToolCall) -> Awaitable[ExecResult]:
            return self.answer(call, workspace)

        sandbox = FakeSandbox(sandbox_id, self.base_dir, handler)
        self.sandboxes.append(sandbox)
        return sandbox


# Keyword in the question → the program the scripted model runs (as tests/interpreter/fake_llm.py
# has it, for the programs `canned` knows), and the answer it then gives.
PROGRAMS = {"sleep": "import time; time.sleep(600)", "chart": "chart", "page": "page"}
SLOW_ANSWER = "Counting " + " ".join(f"w{i}" for i in range(1, 15)) + " done."


def chat(messages: list[ChatMessage], tools: list[ToolSpec]) -> ModelReply:
    """A scripted model for the interpreter API's tests: a question with a keyword of `PROGRAMS`
    runs its program, and the answer quotes the tool's output ("Result: ..."); "slowly" is
    answered with `SLOW_ANSWER`; anything else with "Hello from the fake model."."""
    last = messages[-1]
    if isinstance(last, ToolResultMessage):
        return answer(f"Result: {last.content}")
    question = last.content.lower() if isinstance(last, UserMessage) else ""
    program = next((code for word, code in PROGRAMS.items() if word in question), None)
    if program is not None:
        return run_python(program)
    return answer(SLOW_ANSWER if "slowly" in question else "Hello from the fake model.")


# Test-sized settings: the fake backend ignores the sandbox limits; these are what the HTTP
# layer reads.
DEFAULTS: dict[str, Any] = {
    "pool_size": 0,
    "log_level": "warning",
    "run_poll_seconds": 0.05,
    "public_base_url": BASE_URL,  # presigned URLs lead back to the app
}


def as_httpx(client: TestClient) -> httpx.Client:
    """Starlette's TestClient is the Client of httpx2 (httpx's API under another name) where
    that is installed: the tests, written against httpx.Client, take it as one."""
    return cast(httpx.Client, client)


class FakeApp:
    """One app over fakes in a scratch directory; `running()` drives it with TestClient,
    `serving()` serves it on loopback (either runs its lifespan)."""

    def __init__(
        self,
        answer: Answer = canned,
        model: ScriptedModel | None = None,
        *,
        configured_model: bool = False,
        **overrides: Any,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sandbank-fake-"))
        self.settings = Settings(data_dir=self.dir, **{**DEFAULTS, **overrides})
        self.backend = CannedBackend(self.settings, answer)
        # As when the app builds its own: the tenants' share depends on how many tokens there are.
        tenants = 0 if self.settings.role == "node" else len(load_tokens(self.settings))
        self.sandboxes = LocalSandboxes(self.settings, self.backend, tenants=tenants)
        # `configured_model`: the model the settings name (none here: questions are refused).
        self.model = None if configured_model else model or ScriptedModel(chat)
        self.app = create_app(self.settings, sandboxes=self.sandboxes, model=self.model)
        # As when the app builds its own: the sandboxes report to the app's metrics.
        self.sandboxes.hooks = SandboxHooks(self.app.state.services.metrics)
        self._test_client: TestClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def store(self) -> Store:
        interpreter = self.app.state.services.interpreter
        assert interpreter is not None
        store: Store = interpreter.store
        return store

    @property
    def http(self) -> httpx.Client | None:
        """The client of `running()`, while it runs."""
        return None if self._test_client is None else as_httpx(self._test_client)

    @contextlib.contextmanager
    def running(self) -> Iterator[httpx.Client]:
        """The app started (its lifespan run) and a client to it; everything removed after."""
        try:
            with TestClient(self.app, base_url=BASE_URL, client=CLIENT) as http:
                self._test_client = http
                yield as_httpx(http)
        finally:
            self._test_client = None
            shutil.rmtree(self.dir, ignore_errors=True)

    @contextlib.contextmanager
    def serving(self, port: int | None = None) -> Iterator[str]:
        """The app served by uvicorn on a loopback port, in a thread of this process, with the
        listener `sandbank serve` uses: for what TestClient cannot show (a response read as it
        is written, a client of its own such as a fleet front or an SDK, the edge's bounds on
        connections and heads). Yields its base URL; `port` is one chosen beforehand (for
        settings that name the URL, as `public_base_url` does)."""
        port = port or free_port()
        # As `sandbank serve` serves it: the bounded edge (heads, connections, timeouts).
        book = connection_book(self.settings)
        self.app.state.services.metrics.watch_connections(book)
        config = listener_config(self.app, "127.0.0.1", port, self.settings, "on", book)
        server = uvicorn.Server(config)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),))
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "did not start"
                time.sleep(0.01)
            self._loop = loop
            yield f"http://127.0.0.1:{port}"
        finally:
            self._loop = None
            server.should_exit = True
            thread.join(30)
            loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Run a coroutine function on the app's event loop (its store lives there)."""
        if self._loop is not None:
            return asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(30)
        running = self._test_client
        assert running is not None and running.portal is not None, "use `running()`"
        result: T = running.portal.call(fn, *args)
        return result

    def workspace(self, exec_session_id: str) -> Path:
        """Where a code-execution session's files are (the fake keeps a real directory)."""
        session = next(s for s in self.sandboxes.sessions() if s.id == exec_session_id)
        return session.sandbox.workspace

    def new_user(self, name: str | None = None) -> tuple[str, str]:
        """A user and an API key of theirs (what `sandbank users create` does)."""
        name = name or f"u{uuid.uuid4().hex[:8]}"
        self.call(self.store.accounts.create_user, name)
        _, secret = self.call(self.store.accounts.create_key, name)
        return name, secret

    @contextlib.contextmanager
    def client(self, app: Any = None, **kwargs: Any) -> Iterator[httpx.Client]:
        """Another client of the running app, with headers of its own (a second browser); of
        `app` instead, one over the same services (the code-execution API's own listener)."""
        assert self._test_client is not None, "use `running()`"
        other = TestClient(app or self.app, base_url=BASE_URL, client=CLIENT, **kwargs)
        other.portal = self._test_client.portal  # the running app's loop, not a lifespan
        try:
            yield as_httpx(other)
        finally:
            other.portal = None
            other.close()

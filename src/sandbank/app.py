"""create_app(settings): builds the services, mounts both APIs and the web UI, runs the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from .access import AccessMiddleware
from .admin import sessions_endpoint
from .agent.anyllm import model_from_settings
from .agent.model import Model
from .config import Settings
from .errors import ConfigError, ModelEndpointRefused, ModelNotConfigured, SandbankError
from .execapi import openapi
from .execapi.auth import TokenAuth, load_tokens
from .execapi.routes import ExecApi
from .files import ObjectStore, open_object_store
from .fleet.front import Fleet, FrontApi
from .fleet.node import FleetGate, NodeControl, node_settings
from .fleet.sandboxes import FleetSandboxes
from .http import EXCEPTION_HANDLERS, HostAllowList
from .interpreter.files import SessionFiles
from .interpreter.identity import Identity
from .interpreter.routes import InterpreterApi
from .interpreter.runs import Runs
from .interpreter.service import InterpreterService
from .leasing import Sandboxes, open_sandboxes
from .metrics import MeteredModel, MeteredRuntime, Metrics, endpoint
from .sandbox.sessions import Runtime
from .startup import without_credentials
from .store import Store, database_url, open_store
from .store.lockfile import ServeLock
from .web import site

log = logging.getLogger("sandbank")
RESTARTED = "interrupted by a server restart"
UNAVAILABLE = "the assistant is not available; ask the administrator"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings, tokens: list[str]) -> None:
    """An unauthenticated code-execution API is remote code execution for anyone who reaches it."""
    if settings.exec_api == "off" or tokens:
        return
    host = settings.exec_api_host if settings.exec_api == "separate" else settings.host
    if not is_loopback(host):
        raise ConfigError(
            f"refusing to serve the code-execution API on {host} without tokens: "
            "anyone who reaches it could run code. Set SANDBANK_EXEC_TOKENS (or "
            "SANDBANK_EXEC_TOKENS_FILE), listen on 127.0.0.1, serve it on a loopback listener "
            "of its own (SANDBANK_EXEC_API=separate), or set SANDBANK_EXEC_API=off"
        )


def build_model(settings: Settings) -> Model | SandbankError:
    """The configured model, or why there is none (then questions are refused at once)."""
    try:
        return model_from_settings(settings)
    except (ModelNotConfigured, ModelEndpointRefused) as e:
        # The details are the operator's (variables, providers); users see a plain sentence.
        log.warning("the agent is off: %s", e.message)
        return type(e)(UNAVAILABLE)


class Services:
    """Everything the server is made of, built once per app (never at import time)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        # The fleet roles (src/sandbank/fleet): a node serves its runtime to the fronts alone;
        # a front has no runtime and proxies to the nodes.
        self.node: NodeControl | None = None
        self.fleet: Fleet | None = None
        self.runtime: Runtime | None = None
        self.exec_api: ExecApi | FrontApi
        if settings.role == "front":
            tokens = load_tokens(settings)
            check_exposure(settings, tokens)
            self.auth = TokenAuth(tokens)
            self.fleet = Fleet(settings)
            self.metrics.watch_fleet(self.fleet.membership)
            self.exec_api = FrontApi(self.fleet, self.auth.tenant)
        else:
            self.runtime = MeteredRuntime(settings, self.metrics)
            tokens = [] if settings.role == "node" else load_tokens(settings)
            if settings.role == "node":
                self.node = NodeControl(settings, self.runtime)
            else:
                check_exposure(settings, tokens)
            self.auth = TokenAuth(tokens)
            self.exec_api = ExecApi(self.runtime, self.auth)
        self.interpreter_api = InterpreterApi(settings.message_max_chars)
        # Opened in `start` (they need the event loop):
        self.store: Store | None = None
        self.objects: ObjectStore | None = None
        self.sandboxes: Sandboxes | None = None
        self.model: Model | SandbankError | None = None
        self.interpreter: InterpreterService | None = None
        self.identity: Identity | None = None
        self._expiry: asyncio.Task[None] | None = None
        self._runs: asyncio.Task[None] | None = None
        self._shutdown: asyncio.Task[None] | None = None
        self._serve_lock: ServeLock | None = None

    async def start(self) -> None:
        if self.runtime is not None:
            await self.runtime.start()
        if self.fleet is not None:
            await self.fleet.start()
        if self.settings.interpreter_api == "on":
            await self._start_interpreter()

    async def _start_interpreter(self) -> None:
        s = self.settings
        alone = self._lock_sqlite()
        self.store = store = await open_store(s)
        failed = await store.runs.fail_orphan_pending(RESTARTED)
        if failed:
            log.warning("%d run(s) ended by the restart were marked ERROR", len(failed))
        if alone:
            # No other process serves this database: runs it held died with it, and are
            # continued now rather than once their leases expire.
            taken = await store.runs.expire_leases()
            if taken:
                log.warning("%d run(s) of a server that stopped will be continued", taken)
        self.objects = objects = await open_object_store(s)
        sandboxes: Sandboxes
        if self.fleet is not None:
            sandboxes = FleetSandboxes(s, self.fleet)
        else:
            assert self.runtime is not None
            sandboxes = open_sandboxes(s, self.runtime)
        self.sandboxes = sandboxes
        await sandboxes.start()
        model = build_model(s)
        endpoint = f"{s.llm_model} at {without_credentials(s.llm_base_url) or 'its provider'}"
        self.model = (
            model
            if isinstance(model, SandbankError)
            else MeteredModel(model, self.metrics, endpoint)
        )
        files = SessionFiles(store, objects, s, on_file=self.metrics.file_moved)
        runs = Runs(store, files, sandboxes, self.model, s, on_ended=self.metrics.run_ended)
        self.interpreter = InterpreterService(store, files, runs, s)
        self.identity = Identity(store, s)
        self.interpreter_api.bind(self.interpreter, self.identity)
        self._expiry = asyncio.create_task(self.interpreter.expire_forever())
        self._runs = asyncio.create_task(runs.serve_forever(), name="runs")

    def _lock_sqlite(self) -> bool:
        """SQLite is for one serving process: True when this one is alone on its database."""
        url = database_url(self.settings)
        if not url.startswith("sqlite:///"):
            return False
        lock = ServeLock(Path(url.removeprefix("sqlite:///")))
        holder = lock.acquire()
        if holder is not None:
            log.warning(
                "another sandbank server already serves the SQLite database %s (%s). SQLite is "
                "for one server process: runs stay consistent, but the two compete for one "
                "writer and its runs are taken over only when their leases expire. For several "
                "replicas use PostgreSQL (SANDBANK_DATABASE_URL); otherwise stop one of them.",
                lock.database,
                holder,
            )
            return False
        self._serve_lock = lock
        return True

    def begin_shutdown(self) -> asyncio.Task[None]:
        """No more runs are claimed; running ones finish within the grace period or are handed
        back to the fleet; then every sandbox goes (once)."""
        if self._shutdown is None:
            self._shutdown = asyncio.get_running_loop().create_task(self._shut_down())
        return self._shutdown

    async def before_exit(self) -> None:
        """On SIGTERM, before anything stops: a node drains; a front keeps serving for a
        while with its /health at 503, so load balancers stop sending to it first."""
        if self.node is not None:
            await self.node.drain()
        if self.fleet is not None:
            self.fleet.terminating = True
            await asyncio.sleep(self.settings.shutdown_delay_seconds)

    async def _shut_down(self) -> None:
        if self.interpreter is not None:
            await self.interpreter.shutdown()
        if self.runtime is not None:
            await self.runtime.shutdown()

    async def stop(self) -> None:
        await self.begin_shutdown()
        for task in (self._expiry, self._runs):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.sandboxes is not None:
            await self.sandboxes.close()
        if isinstance(self.model, MeteredModel):
            await self.model.aclose()
        if self.objects is not None:
            await self.objects.close()
        if self.identity is not None:
            await self.identity.key_use.settle()
        if self.store is not None:
            await self.store.close()
        if self._serve_lock is not None:
            self._serve_lock.release()
        if self.fleet is not None:
            await self.fleet.close()


def _cors(settings: Settings) -> list[Middleware]:
    """Same origin only unless origins are configured (browsers then enforce CORS)."""
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )
    ]


def create_app(settings: Settings) -> Starlette:
    if settings.role == "node":
        settings = node_settings(settings)
    services = Services(settings)
    routes: list[BaseRoute] = []
    if settings.interpreter_api == "on":
        routes.append(
            Mount("/api", routes=services.interpreter_api.routes(), middleware=_cors(settings))
        )
    if settings.exec_api == "on":
        routes += services.exec_api.routes()
        routes.append(Route("/openapi.json", _openapi, methods=["GET"]))
    else:
        routes.append(Route("/health", services.exec_api.health, methods=["GET"]))
    if settings.web_ui == "on" and settings.interpreter_api == "on":
        routes += site(settings)
    routes.append(Route("/metrics", endpoint(services.metrics, services.auth), methods=["GET"]))
    if services.runtime is not None:
        admin = sessions_endpoint(services.runtime, settings)
        routes.append(Route("/admin/sessions", admin, methods=["GET"]))
    middleware = [
        Middleware(AccessMiddleware, metrics=services.metrics),
        Middleware(HostAllowList, allowed=settings.allowed_hosts.split(",")),
    ]
    if services.node is not None:
        routes += services.node.routes()
        token = settings.fleet_token.get_secret_value()
        middleware.append(Middleware(FleetGate, token=token, control=services.node))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await services.start()
        try:
            yield
        finally:
            await services.stop()

    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    app.state.services = services
    return app


def create_exec_app(services: Services, settings: Settings) -> Starlette:
    """The code-execution API alone, for a listener of its own over the main app's services."""
    return Starlette(
        routes=[
            *services.exec_api.routes(),
            Route("/openapi.json", _openapi, methods=["GET"]),
            Route("/metrics", endpoint(services.metrics, services.auth), methods=["GET"]),
        ],
        middleware=[
            Middleware(AccessMiddleware, metrics=services.metrics),
            Middleware(HostAllowList, allowed=settings.allowed_hosts.split(",")),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi.document())

"""The composition root: `create_app(settings)` builds every part it is not handed, in one phase.

Tests hand in fakes (`sandboxes` over the fake backend, `store`, `objects`, `model`) and drive
the whole app with Starlette's TestClient; `sandbank serve` hands in nothing. What a part needs
of the event loop (tasks, connections) waits for the lifespan's `start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from .agent.anyllm import model_from_settings
from .agent.model import Model
from .agent.reach import OFF, ModelReach
from .config import Settings
from .e2b.door import E2bDoor, E2bRouting
from .errors import ModelEndpointRefused, ModelNotConfigured, SandbankError
from .execapi import openapi
from .execapi.admin import sessions_endpoint
from .execapi.beside import BesideApi
from .execapi.routes import ExecApi
from .files import ObjectStore, open_object_store
from .files.signing import load_signing_key
from .fleet.front import Fleet, FrontApi
from .fleet.node import FleetGate, NodeControl, node_settings
from .fleet.sandboxes import FleetSandboxes
from .http.access import AccessMiddleware
from .http.auth import TokenAuth, load_tokens
from .http.errors import EXCEPTION_HANDLERS
from .http.hosts import HostAllowList
from .http.routing import grouped_routes
from .http.scrape import endpoint
from .interpreter.files import SessionFiles
from .interpreter.identity import Identity
from .interpreter.routes import InterpreterApi
from .interpreter.runs import Runs
from .interpreter.service import InterpreterService
from .looplag import LoopLag
from .mcp.door import McpDoor
from .mcp.http import McpHttp
from .metrics import MeteredModel, Metrics, SandboxHooks
from .sandbox.local import LocalSandboxes
from .sandbox.port import Sandboxes
from .startup import check_exposure, without_credentials
from .store import Store, database_url, open_store
from .store.lockfile import ServeLock
from .web import site

log = logging.getLogger("sandbank")
RESTARTED = "interrupted by a server restart"


def build_model(settings: Settings) -> Model | SandbankError:
    """The configured model, or why there is none (then questions are refused at once)."""
    try:
        return model_from_settings(settings)
    except (ModelNotConfigured, ModelEndpointRefused) as e:
        # The details are the operator's (variables, providers); users see a plain sentence.
        log.warning("the agent is off: %s", e.message)
        return type(e)(OFF)


class Interpreter:
    """The interpreter API's parts: store, files, model, runs, the service and who calls."""

    def __init__(
        self,
        settings: Settings,
        sandboxes: Sandboxes,
        metrics: Metrics,
        store: Store | None,
        objects: ObjectStore | None,
        model: Model | None,
        *,
        owns_sandboxes: bool,
    ) -> None:
        self.settings = s = settings
        self.sandboxes = sandboxes
        self.owns_sandboxes = owns_sandboxes  # a remote backend of its own, not the server's
        self.store = store or open_store(s)
        self.objects = objects or open_object_store(s)
        built = model if model is not None else build_model(s)
        endpoint = f"{s.llm_model} at {without_credentials(s.llm_base_url) or 'its provider'}"
        self.model: Model | SandbankError = (
            built if isinstance(built, SandbankError) else MeteredModel(built, metrics, endpoint)
        )
        files = SessionFiles(self.store, self.objects, s, on_file=metrics.file_moved)
        self.reach = ModelReach(s, configured=not isinstance(self.model, SandbankError))
        self.runs = Runs(
            self.store, files, sandboxes, self.model, s, on_ended=metrics.run_ended,
            reach=self.reach,
        )  # fmt: skip
        self.service = InterpreterService(self.store, files, self.runs, s)
        self.identity = Identity(self.store, s)
        self.api = InterpreterApi(self.service, self.identity, s.message_max_chars)
        self._tasks: list[asyncio.Task[None]] = []
        self._serve_lock: ServeLock | None = None

    async def start(self) -> None:
        alone = self._lock_sqlite()
        failed = await self.store.runs.fail_orphan_pending(RESTARTED)
        if failed:
            log.warning("%d run(s) ended by the restart were marked ERROR", len(failed))
        if alone:
            # No other process serves this database: runs it held died with it, and are
            # continued now rather than once their leases expire.
            taken = await self.store.runs.expire_leases()
            if taken:
                log.warning("%d run(s) of a server that stopped will be continued", taken)
        if self.owns_sandboxes:
            await self.sandboxes.start()
        self._tasks = [
            asyncio.create_task(self.service.expire_forever(), name="expiry"),
            asyncio.create_task(self.runs.serve_forever(), name="runs"),
            asyncio.create_task(self._check_model(), name="model check"),
        ]

    async def _check_model(self) -> None:
        verdict = await self.reach.check()
        if verdict.state == "unreachable":
            log.warning(
                "the model's endpoint %s:%s does not answer: questions are refused until it "
                "does (check SANDBANK_LLM_BASE_URL and that the model's server runs)",
                *(self.reach.target or ("?", "?")),
            )

    def _lock_sqlite(self) -> bool:
        """SQLite is for one serving process: True when this one is alone on its database."""
        url = database_url(self.settings)
        if not url.startswith("sqlite:///"):
            return False
        lock = ServeLock.of_database(Path(url.removeprefix("sqlite:///")))
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

    async def shutdown(self) -> None:
        """No more runs are claimed; running ones finish within the grace period or are
        handed back to the fleet."""
        await self.service.shutdown()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.owns_sandboxes:
            await self.sandboxes.close()
        if isinstance(self.model, MeteredModel):
            await self.model.aclose()
        await self.objects.close()
        await self.identity.key_use.settle()
        await self.store.close()
        if self._serve_lock is not None:
            self._serve_lock.release()


class Services:
    """Everything the server is made of, built once per app in one phase (never at import)."""

    def __init__(
        self,
        settings: Settings,
        *,
        sandboxes: Sandboxes | None = None,
        store: Store | None = None,
        objects: ObjectStore | None = None,
        model: Model | None = None,
    ) -> None:
        self.settings = s = settings
        self.metrics = Metrics()
        self.loop_lag = LoopLag()
        self.metrics.watch_loop(self.loop_lag)
        self._lag_task: asyncio.Task[None] | None = None
        # This machine's sandboxes (a single server, or a fleet node); a front has none: it
        # places sessions on the nodes (src/sandbank/fleet).
        self.local: LocalSandboxes | None = None
        self.fleet: Fleet | None = None
        self.node: NodeControl | None = None
        self.node_objects: ObjectStore | None = None
        self.exec_api: ExecApi | FrontApi
        tokens = [] if s.role == "node" else load_tokens(s)
        for warning in check_exposure(s, tokens):
            log.warning("%s", warning)
        self.auth = TokenAuth(tokens)
        if s.role == "front":
            self.fleet = Fleet(s)
            self.metrics.watch_fleet(self.fleet.membership)
            self.exec_api = FrontApi(self.fleet, self.auth.tenant)
            door_sandboxes: Sandboxes = FleetSandboxes(self.fleet)
        else:
            if sandboxes is None:
                sandboxes = self.local = LocalSandboxes(
                    s,
                    hooks=SandboxHooks(self.metrics),
                    tenants=len(tokens),
                    snapshot_key=lambda: load_signing_key(s),  # snapshots are signed with it too
                )
            elif isinstance(sandboxes, LocalSandboxes):
                self.local = sandboxes
            if self.local is not None:
                self.metrics.watch_sandboxes(self.local)
            if s.role == "node":
                assert self.local is not None, "a fleet node serves its own sandboxes"
                # Where a drain moves its sessions: the deployment's object store.
                self.node_objects = objects or open_object_store(s)
                self.node = NodeControl(
                    s, self.local, self.node_objects, counted=self.metrics.session_moved
                )
            door_sandboxes = sandboxes
            self.exec_api = ExecApi(sandboxes, self.auth, s)
        self.sandboxes = door_sandboxes
        # MCP is another door on the code-execution API's sessions, behind its tokens; a node
        # serves its fronts only, and they serve MCP.
        self.mcp: McpHttp | None = None
        if s.exec_api != "off" and s.role != "node":
            self.mcp = McpHttp(McpDoor(door_sandboxes, s), self.auth)
        # E2B's API beside the code-execution API, over the same sandboxes and tenants.
        self.e2b: E2bDoor | None = None
        if s.e2b_api == "on" and s.exec_api != "off" and s.role != "node":
            secret = s.fleet_token.get_secret_value() if s.role == "front" else ""
            self.e2b = E2bDoor(door_sandboxes, self.auth, s, secret)
        self.interpreter: Interpreter | None = None
        if s.interpreter_api == "on":
            if s.sandbox_url:
                from .sandbox.remote import RemoteSandboxes

                interpreter_sandboxes: Sandboxes = RemoteSandboxes(s)
            else:
                interpreter_sandboxes = door_sandboxes  # the server's own: started above
            self.interpreter = Interpreter(
                s, interpreter_sandboxes, self.metrics, store, objects, model,
                owns_sandboxes=interpreter_sandboxes is not door_sandboxes,
            )  # fmt: skip
        self._shutdown: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._lag_task = asyncio.create_task(self.loop_lag.run(), name="loop-lag")
        if self.fleet is not None:
            await self.fleet.start()
        else:
            await self.sandboxes.start()
        if self.interpreter is not None:
            await self.interpreter.start()

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
        if self.fleet is None:
            await self.sandboxes.close()

    async def stop(self) -> None:
        await self.begin_shutdown()
        if self.interpreter is not None:
            await self.interpreter.stop()
        if self.fleet is not None:
            await self.fleet.close()
        if self.node_objects is not None:
            await self.node_objects.close()
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task


def _cors(settings: Settings) -> list[Middleware]:
    """Same origin only unless origins are configured (browsers then enforce CORS)."""
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )
    ]


def create_app(
    settings: Settings,
    *,
    sandboxes: Sandboxes | None = None,
    store: Store | None = None,
    objects: ObjectStore | None = None,
    model: Model | None = None,
) -> Starlette:
    """The whole server over the parts handed in, or the ones the settings name."""
    if settings.role == "node":
        settings = node_settings(settings)
    services = Services(settings, sandboxes=sandboxes, store=store, objects=objects, model=model)
    routes: list[BaseRoute] = []
    if services.interpreter is not None:
        api_routes = services.interpreter.api.routes()
        routes.append(Mount("/api", routes=api_routes, middleware=_cors(settings)))
    if settings.exec_api == "on":
        routes += exec_routes(services)
        routes.append(Route("/openapi.json", _openapi, methods=["GET"]))
        if services.mcp is not None:
            routes.append(services.mcp.route())
    else:
        routes.append(Route("/health", services.exec_api.health, methods=["GET"]))
    if settings.web_ui == "on" and services.interpreter is not None:
        routes += site(settings, services.interpreter.reach)
    routes.append(
        Route(
            "/metrics",
            endpoint(services.metrics, services.auth, settings.metrics_token.get_secret_value()),
            methods=["GET"],
        )
    )
    if services.local is not None:
        admin = sessions_endpoint(services.local, settings)
        routes.append(Route("/admin/sessions", admin, methods=["GET"]))
    middleware = [
        Middleware(AccessMiddleware, metrics=services.metrics),
        Middleware(HostAllowList, allowed=settings.allowed_hosts.split(",")),
    ]
    if services.node is not None:
        routes += services.node.routes()
        token = settings.fleet_token.get_secret_value()
        middleware.append(
            Middleware(
                FleetGate,
                token=token,
                control=services.node,
                metrics_open=bool(settings.metrics_token.get_secret_value()),
            )
        )
    if services.e2b is not None and settings.exec_api == "on":
        middleware.append(Middleware(E2bRouting, door=services.e2b))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await services.start()
        try:
            # The MCP transport's tasks live in this task (on the exec listener's app too).
            async with contextlib.AsyncExitStack() as stack:
                if services.mcp is not None:
                    await stack.enter_async_context(services.mcp.running())
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


def exec_routes(services: Services) -> list[BaseRoute]:
    """The code-execution API's routes. A front serves its additions too (contexts, processes,
    the tree, watches, lifetimes...) over the fleet's port, as E2B's door and MCP do there; its
    own routes come first (it forwards pause and resume to the node as they are)."""
    routes: list[BaseRoute] = [*services.exec_api.routes()]
    if isinstance(services.exec_api, FrontApi):
        served = {(r.path, m) for r in routes if isinstance(r, Route) for m in r.methods or ()}
        table = BesideApi(services.sandboxes, services.auth).table()
        routes += grouped_routes([row for row in table if (row[0], row[1]) not in served])
    return routes


def create_exec_app(services: Services, settings: Settings) -> Starlette:
    """The code-execution API alone, for a listener of its own over the main app's services
    (whose lifespan runs them, MCP's transport included; E2B's API beside it)."""
    routes: list[BaseRoute] = [
        *exec_routes(services),
        Route("/openapi.json", _openapi, methods=["GET"]),
        Route(
            "/metrics",
            endpoint(services.metrics, services.auth, settings.metrics_token.get_secret_value()),
            methods=["GET"],
        ),
    ]
    if services.mcp is not None:
        routes.append(services.mcp.route())
    middleware = [
        Middleware(AccessMiddleware, metrics=services.metrics),
        Middleware(HostAllowList, allowed=settings.allowed_hosts.split(",")),
    ]
    if services.e2b is not None:
        middleware.append(Middleware(E2bRouting, door=services.e2b))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=EXCEPTION_HANDLERS,
    )


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi.document())

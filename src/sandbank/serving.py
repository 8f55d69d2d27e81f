"""Running the server: uvicorn listeners over one set of services, and a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from types import FrameType
from typing import Literal

import uvicorn

from . import capacity
from .app import Services, create_app, create_exec_app
from .config import Settings
from .heap import HeapKeeper
from .http.edge import ConnectionBook, protocol_for
from .startup import listen_socket

log = logging.getLogger("sandbank")

GIL_SWITCH_SECONDS = 0.001


class MainServer(uvicorn.Server):
    """On SIGTERM: stops listening, finishes or hands back running turns, ends calls (with a
    result)."""

    def __init__(
        self, config: uvicorn.Config, services: Services, peers: list[uvicorn.Server]
    ) -> None:
        super().__init__(config)
        self.services = services
        self.peers = peers
        self.exiting = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit and not self.exiting:
            # A fleet node drains and a front lets load balancers notice first (fleet/);
            # a second signal does not wait.
            self.exiting = True
            task = asyncio.get_running_loop().create_task(self.services.before_exit())
            task.add_done_callback(lambda _: self.handle_exit(sig, frame))
            return
        if not self.should_exit:
            # Running turns finish within the grace period or are handed back to the fleet;
            # then destroying the sessions answers in-flight calls, so uvicorn's graceful
            # wait for open requests ends promptly.
            self.services.begin_shutdown()
            for peer in self.peers:
                peer.should_exit = True
        super().handle_exit(sig, frame)


def connection_book(settings: Settings) -> ConnectionBook:
    """The connection bounds of every listener of this process (http/edge.py)."""
    sandboxes = 0 if settings.role == "front" else settings.max_sessions + settings.pool_size_max
    limit = capacity.connection_limit(sandboxes, settings.max_connections)
    if settings.max_connections and limit < settings.max_connections:
        log.warning(
            "SANDBANK_MAX_CONNECTIONS=%d is more than the open-files limit leaves beside %d "
            "sandboxes: %d connections at most (raise `ulimit -Hn`)",
            settings.max_connections, sandboxes, limit,
        )  # fmt: skip
    per_client = settings.max_connections_per_client or max(1, limit // 2)
    return ConnectionBook(limit, min(per_client, limit), settings.head_timeout_seconds)


def listener_config(
    app: object,
    host: str,
    port: int,
    settings: Settings,
    lifespan: Literal["on", "off"],
    book: ConnectionBook,
) -> uvicorn.Config:
    """How every listener is served: the bounded edge (http/edge.py), our logging, a
    graceful shutdown (tests/fakeapp.py serves its app with it too)."""
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host,
        port=port,
        http=protocol_for(book),  # httptools, bounded: heads, time, connections, early answers
        backlog=capacity.ACCEPT_BACKLOG,
        timeout_keep_alive=settings.keepalive_timeout_seconds,  # type: ignore[arg-type]
        log_level=settings.log_level,
        log_config=None,  # uvicorn's lines go through our handler (text or JSON, request ids)
        access_log=False,
        # Which peers' headers are believed is SANDBANK_TRUSTED_PROXIES' to say: uvicorn's own
        # handling would take any loopback peer's X-Forwarded-For as the client's address.
        proxy_headers=False,
        lifespan=lifespan,
        timeout_graceful_shutdown=30,
    )


def run(settings: Settings, announce: str = "") -> int:
    """Serve until a signal; the code-execution API on its own listener when so configured.
    `announce` is logged once the listeners are bound (the start-up summary)."""
    # Bound before anything starts: a port in use is one line (ConfigError), not a traceback
    # after the sandboxes started.
    sockets = [listen_socket(settings.host, settings.port)]
    if settings.exec_api == "separate":
        sockets.append(listen_socket(settings.exec_api_host, settings.exec_api_port))
    # Work handed to threads (sweeps, file reads, store calls) is Python too: a thread keeps the
    # GIL until the interpreter asks it to switch, 5 ms by default, and every such slice was a
    # stall of the event loop (the loop lag read ~5.3 ms at 1,000 sessions, the sweep's slice).
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    if announce:
        log.info("%s", announce)
    app = create_app(settings)
    services: Services = app.state.services
    book = connection_book(settings)
    services.metrics.watch_connections(book)
    heap = HeapKeeper()
    services.metrics.watch_heap(heap)
    peers: list[uvicorn.Server] = []
    if settings.exec_api == "separate":
        exec_app = create_exec_app(services, settings)
        host, port = settings.exec_api_host, settings.exec_api_port
        peers.append(uvicorn.Server(listener_config(exec_app, host, port, settings, "off", book)))
    config = listener_config(app, settings.host, settings.port, settings, "on", book)
    main = MainServer(config, services, peers)
    # asyncio's own loop, not uvloop: uvloop's pipe transports close their descriptor twice
    # (MagicStack/uvloop#763), which under load closed other sandboxes' pipes and the fork
    # template's socket, and its subprocesses inherit every inheritable descriptor.
    try:
        asyncio.run(_serve(main, peers, sockets, heap))
    except SystemExit:  # uvicorn's own exit at a failed start, after logging why
        return 1
    return 0 if main.started else 1


async def _serve(
    main: MainServer, peers: list[uvicorn.Server], sockets: list[socket.socket], heap: HeapKeeper
) -> None:
    task = asyncio.create_task(main.serve(sockets=sockets[:1]))
    # Peers share the main app's services: they listen once its lifespan has started them.
    while not main.started and not task.done():  # noqa: ASYNC110 - uvicorn has no event
        await asyncio.sleep(0.05)
    keeper = None
    if main.started:
        # What start-up made (~285,000 objects: the SDKs, the ORM, the routes) is frozen, and
        # what lives later as it settles (heap.py): no collection walks them all per request.
        heap.settle()
        keeper = asyncio.create_task(heap.run(), name="heap")
    peer_tasks = [
        asyncio.create_task(p._serve(sockets=[sock]))
        for p, sock in zip(peers, sockets[1:], strict=True)
        if main.started
    ]
    try:
        await task
    finally:
        for peer in peers:
            peer.should_exit = True
        await asyncio.gather(*peer_tasks, return_exceptions=True)
        if keeper is not None:
            keeper.cancel()

"""Prometheus metrics: one registry per app, moved at a few choke points, served at /metrics.

The parts they measure know nothing of metrics: the HTTP middleware counts requests by route
and status, `SandboxHooks` is told of the local sandboxes' leases, capacity refusals, calls and
restarts (their `Hooks`), and `MeteredModel` wraps the model (calls, tokens, latency).
Labels are fixed vocabularies (route templates, tool names, outcomes), never ids or secrets.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .agent.model import ChatMessage, Model, ModelReply, TextSink, ToolSpec
from .errors import AgentError
from .heap import HeapKeeper
from .looplag import LoopLag
from .protocol.calls import (
    RC_KILLED,
    RC_TIMEOUT,
    BashCall,
    EditorCall,
    ExecResult,
    RestartReason,
    ToolCall,
)

if TYPE_CHECKING:
    from .fleet.membership import Membership
    from .http.edge import ConnectionBook
    from .sandbox.local import LocalSandboxes

log = logging.getLogger("sandbank.model")
# What the worker appends to a stream it cut (sandbox/inside/worker.py).
TRUNCATED = re.compile(r"\n\[output truncated: \d+ more bytes not shown\]\n$")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 600)


def tool_name(call: ToolCall) -> str:
    if isinstance(call, BashCall):
        return "bash"
    if isinstance(call, EditorCall):
        return "editor"
    return "python"


def outcome_of(result: ExecResult) -> str:
    """A return code in words: ok, error, timeout, killed (memory, destroy) or signal."""
    code = result.return_code
    if code == 0:
        return "ok"
    if code == RC_TIMEOUT:
        return "timeout"
    if code == RC_KILLED:
        return "killed"
    if code > 128:
        return "signal"
    return "error"


M = TypeVar("M", Counter, Histogram)


class Metrics:
    """Every metric of one server, in a registry of its own (tests build as many as they like)."""

    def __init__(self) -> None:
        # Labelled children met before, found with one dict lookup: `labels()` validates and
        # locks at each call, and the hot paths count every request (labels are fixed words).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry = CollectorRegistry()
        self.http_requests = Counter(
            "sandbank_http_requests",
            "HTTP requests answered.",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_seconds = Histogram(
            "sandbank_http_request_seconds",
            "Time to answer an HTTP request (to the start of the response).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.http_bytes = Counter(
            "sandbank_http_bytes",
            "Bytes of request and response bodies (file uploads and downloads among them).",
            ["route", "direction"],
            registry=r,
        )
        self.sessions_created = Counter(
            "sandbank_sessions_created", "Sandbox sessions leased.", registry=r
        )
        self.sessions_destroyed = Counter(
            "sandbank_sessions_destroyed", "Sandbox sessions released by a client.", registry=r
        )
        self.capacity_refusals = Counter(
            "sandbank_capacity_refusals",
            "Leases refused: at capacity or shutting down.",
            registry=r,
        )
        self.pool_ready = Gauge(
            "sandbank_pool_ready", "Sandboxes started and waiting in the warm pool.", registry=r
        )
        self.exec_seconds = Histogram(
            "sandbank_exec_seconds",
            "Time of one tool call in a sandbox.",
            ["tool"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.exec_results = Counter(
            "sandbank_exec_results",
            "Tool calls by how they ended: ok, error (non-zero), timeout (124), killed (137), "
            "signal (128+N).",
            ["tool", "outcome"],
            registry=r,
        )
        self.sandbox_restarts = Counter(
            "sandbank_sandbox_restarts",
            "Session interpreters replaced by a fresh one, by reason: timeout (killed when it "
            "ignored the interrupt), memory, crash, protocol, cancelled (a cancelled call that "
            "did not stop).",
            ["reason"],
            registry=r,
        )
        self.truncations = Counter(
            "sandbank_output_truncations",
            "Tool calls whose output was cut at SANDBANK_OUTPUT_LIMIT_BYTES, by stream.",
            ["stream"],
            registry=r,
        )
        self.files = Counter(
            "sandbank_files",
            "Interpreter API files: uploads recorded, files runs produced, download URLs handed "
            "out (code-execution file transfers are counted by route, in sandbank_http_*).",
            ["op"],
            registry=r,
        )
        self.file_bytes = Counter(
            "sandbank_file_bytes", "Bytes of those files, by operation.", ["op"], registry=r
        )
        self.model_calls = Counter(
            "sandbank_model_calls", "Requests to the model, by outcome.", ["outcome"], registry=r
        )
        self.model_seconds = Histogram(
            "sandbank_model_seconds",
            "Time of one model request.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.model_tokens = Counter(
            "sandbank_model_tokens",
            "Tokens sent to (in) and written by (out) the model.",
            ["direction"],
            registry=r,
        )
        self.sessions_moved = Counter(
            "sandbank_fleet_sessions_moved",
            "A fleet node's session snapshots through the object store: `out` at a drain, "
            "`checkpoint` copied as taken, `in` adopted here.",
            ["direction"],
            registry=r,
        )
        self.agent_runs = Counter(
            "sandbank_agent_runs",
            "Agent runs ended on this replica, by outcome (done, error, cancelled).",
            ["outcome"],
            registry=r,
        )
        self.agent_steps = Histogram(
            "sandbank_agent_steps",
            "Model calls one agent run took.",
            buckets=(1, 2, 3, 5, 8, 13, 20, 40),
            registry=r,
        )

    def child(self, metric: M, *labels: str) -> M:
        """`metric.labels(*labels)`, looked up once."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return cast(M, found)

    def session_moved(self, direction: str) -> None:
        """A fleet node moved a session's snapshot (`MovedSnapshots`' hook)."""
        self.sessions_moved.labels(direction).inc()

    def run_ended(self, outcome: str, steps: int) -> None:
        """An agent run ended (`Runs`' hook): counted by outcome, its steps observed."""
        self.agent_runs.labels(outcome).inc()
        if steps:
            self.agent_steps.observe(steps)

    def file_moved(self, op: str, size: int) -> None:
        """A file of a session was stored or handed out (`SessionFiles`' hook)."""
        self.files.labels(op).inc()
        self.file_bytes.labels(op).inc(size)

    def watch_sandboxes(self, local: LocalSandboxes) -> None:
        """Gauges read the local sandboxes when scraped: no bookkeeping can drift."""
        self.registry.register(LocalSandboxUse(local))
        self.pool_ready.set_function(lambda: local.status()["pool_ready"])
        Gauge(
            "sandbank_sessions_max",
            "Sessions this server leases at most (SANDBANK_MAX_SESSIONS).",
            registry=self.registry,
        ).set(local.settings.max_sessions)

    def watch_connections(self, book: ConnectionBook) -> None:
        """The connection edge (http/edge.py): open connections, their cap, refusals."""
        self.registry.register(Connections(book))

    def watch_loop(self, lag: LoopLag) -> None:
        """The event loop's longest stall of the last window, read when scraped."""
        Gauge(
            "sandbank_event_loop_lag_seconds",
            f"The longest the event loop was late for due work in the last {lag.window:g} s "
            "(work run on the loop without yielding: it delays every request).",
            registry=self.registry,
        ).set_function(lag.longest)
        Gauge(
            "sandbank_event_loop_lag_max_seconds",
            "The longest the event loop was late for due work since the server started.",
            registry=self.registry,
        ).set_function(lambda: lag.worst)

    def watch_heap(self, heap: HeapKeeper) -> None:
        """The server's own heap (heap.py): what is frozen out of the collector's walks."""
        Gauge(
            "sandbank_heap_frozen_objects",
            "Objects kept out of the cycle collector's walks (counted at the last full "
            "collection, plus those frozen since).",
            registry=self.registry,
        ).set_function(lambda: heap.frozen)
        Gauge(
            "sandbank_heap_full_collections",
            "Full collections of the server's heap since it started (when it has doubled).",
            registry=self.registry,
        ).set_function(lambda: heap.full_collections)
        Gauge(
            "sandbank_heap_full_collection_seconds",
            "How long the last full collection held the event loop.",
            registry=self.registry,
        ).set_function(lambda: heap.last_full_seconds)

    def watch_fleet(self, membership: Membership) -> None:
        """A front's view of its nodes' capacity, read from their latest reports when scraped."""
        self.registry.register(FleetCapacity(membership))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Connections(Collector):
    """`sandbank_connections{state}` (open, max) and the connections refused at once."""

    def __init__(self, book: ConnectionBook) -> None:
        self.book = book

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "sandbank_connections", "Client connections: open now, and the cap.", labels=["state"]
        )
        family.add_metric(["open"], self.book.open)
        family.add_metric(["max"], self.book.max_connections)
        yield family
        refused = CounterMetricFamily(
            "sandbank_connections_refused",
            "Connections answered 503 at once: the server's or an address's cap reached.",
        )
        refused.add_metric([], self.book.refused)
        yield refused
        heads = CounterMetricFamily(
            "sandbank_request_heads_refused",
            "Requests answered 408, 414 or 431: a head too slow, too long or too large.",
        )
        heads.add_metric([], self.book.heads_refused)
        yield heads


class LocalSandboxUse(Collector):
    """`sandbank_sessions{state}`: leased sessions running a call (busy) or not (idle, paused);
    `sandbank_sandbox_memory_bytes{part}`: the sandboxes' charge, the fork template's PSS."""

    def __init__(self, local: LocalSandboxes) -> None:
        self.local = local

    def collect(self) -> Iterator[Metric]:
        states = GaugeMetricFamily(
            "sandbank_sessions", "Sandbox sessions leased now, by state.", labels=["state"]
        )
        sessions = self.local.sessions()
        busy = sum(1 for s in sessions if s.inflight)
        paused = sum(1 for s in sessions if s.paused and not s.inflight)
        states.add_metric(["busy"], busy)
        states.add_metric(["idle"], len(sessions) - busy - paused)
        states.add_metric(["paused"], paused)
        yield states
        memory = GaugeMetricFamily(
            "sandbank_sandbox_memory_bytes",
            "Memory held for sandboxes: `sandboxes` is what all of them (pooled ones too) are "
            "charged together, `template` the fork templates' own (PSS), apart from them.",
            labels=["part"],
        )
        for part, size in sorted(self.local.backend.memory().items()):
            memory.add_metric([part], size)
        yield memory


class FleetCapacity(Collector):
    """`sandbank_fleet_nodes{state}` and each node's sessions and room, as a front sees them."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership

    def collect(self) -> Iterator[Metric]:
        states = dict.fromkeys(("accepting", "full", "draining", "down"), 0)
        used = GaugeMetricFamily(
            "sandbank_fleet_node_sessions",
            "Sessions on each node (its last report, and those placed since).",
            labels=["node"],
        )
        room = GaugeMetricFamily(
            "sandbank_fleet_node_max_sessions",
            "Sessions each node leases at most (its last report).",
            labels=["node"],
        )
        for member in self.membership.members.values():
            report = member.report
            if not member.up or report is None:
                states["down"] += 1
                continue
            if report.draining:
                states["draining"] += 1
            else:
                states["accepting" if member.accepting() else "full"] += 1
            used.add_metric([member.name], member.used())
            room.add_metric([member.name], report.max_sessions)
        nodes = GaugeMetricFamily(
            "sandbank_fleet_nodes", "Nodes this front knows, by state.", labels=["state"]
        )
        for state, count in states.items():
            nodes.add_metric([state], count)
        yield nodes
        yield used
        yield room


class SandboxHooks:
    """The local sandboxes' `Hooks`: leases, refusals, calls and restarts, counted."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def created(self) -> None:
        self.metrics.sessions_created.inc()

    def refused(self) -> None:
        self.metrics.capacity_refusals.inc()

    def executed(self, call: ToolCall, result: ExecResult, seconds: float) -> None:
        tool, m = tool_name(call), self.metrics
        m.child(m.exec_seconds, tool).observe(seconds)
        m.child(m.exec_results, tool, outcome_of(result)).inc()
        for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            if TRUNCATED.search(text[-200:]):
                self.metrics.truncations.labels(stream).inc()

    def destroyed(self) -> None:
        self.metrics.sessions_destroyed.inc()

    def restarted(self, reason: RestartReason) -> None:
        self.metrics.sandbox_restarts.labels(reason).inc()


class MeteredModel:
    """A `Model` that counts the requests, tokens and latency of the one it wraps, and logs
    each failure with the provider and endpoint (the operator's details; users see less)."""

    def __init__(self, model: Model, metrics: Metrics, endpoint: str = "") -> None:
        self.model = model
        self.metrics = metrics
        self.endpoint = endpoint

    async def complete(
        self, messages: list[ChatMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ModelReply:
        started = time.monotonic()
        try:
            reply = await self.model.complete(messages, tools, on_text)
        except AgentError as error:
            self.metrics.model_calls.labels("error").inc()
            log.warning("model request failed (%s): %s", self.endpoint, error.message)
            raise
        finally:
            self.metrics.model_seconds.observe(time.monotonic() - started)
        self.metrics.model_calls.labels("ok").inc()
        self.metrics.model_tokens.labels("in").inc(reply.usage.input_tokens)
        self.metrics.model_tokens.labels("out").inc(reply.usage.output_tokens)
        return reply

    async def aclose(self) -> None:
        close = getattr(self.model, "aclose", None)
        if close is not None:
            await close()

"""A fleet on loopback: node and front processes (real `sandbank serve` with a role)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support import Server

TOKEN = "fleet-test-token-0123456789"
NODE_LIMITS: dict[str, Any] = {
    "pool_size": 1,
    "max_sessions": 6,
    "exec_timeout_max": 30,
    "exec_timeout_default": 30,
}


def node(data: Path, name: str, **overrides: Any) -> Server:
    return Server(
        data,
        role="node",
        fleet_token=TOKEN,
        fleet_node_name=name,
        **{**NODE_LIMITS, **overrides},
    )


def front(data: Path, nodes: list[tuple[str, str]], **overrides: Any) -> Server:
    spec = ",".join(f"{name}={url}" for name, url in nodes)
    settings: dict[str, Any] = {
        "role": "front",
        "fleet_token": TOKEN,
        "fleet_nodes": spec,
        "interpreter_api": "off",
        "exec_timeout_max": 30,
        "exec_timeout_default": 30,
        "fleet_refresh_seconds": 0.5,
    }
    return Server(data, **{**settings, **overrides})


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandbank-fleet-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class LoopbackFleet:
    """N nodes and one front, each a process of its own on a loopback port."""

    def __init__(
        self,
        root: Path,
        nodes: int,
        node_overrides: dict[str, Any] | None = None,
        **front_overrides: Any,
    ) -> None:
        self.nodes: dict[str, Server] = {}
        for i in range(nodes):
            d = root / f"node-{i}"
            d.mkdir(mode=0o711)
            self.nodes[f"node-{i}"] = node(d, f"node-{i}", **(node_overrides or {}))
        d = root / "front"
        d.mkdir(mode=0o711)
        self.front = front(d, [(n, s.base_url) for n, s in self.nodes.items()], **front_overrides)

    def start(self) -> LoopbackFleet:
        try:
            for s in self.nodes.values():
                s.start()
            self.front.start()
        except BaseException:
            self.stop()  # what did start is not left running
            raise
        return self

    def stop(self) -> None:
        self.front.stop()
        for s in self.nodes.values():
            if s.proc is not None and s.proc.returncode == -signal.SIGKILL:
                # A node started on the data dir of a killed one removes what it left behind
                # (cgroups, loop-mounted workspaces).
                s.start()
            if s.proc is not None:
                s.stop()

    # What the conformance tests use of a server:
    @property
    def base_url(self) -> str:
        return self.front.base_url

    @property
    def port(self) -> int:
        return self.front.port

    def client(self, **kwargs: Any) -> Any:
        return self.front.client(**kwargs)

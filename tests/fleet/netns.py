"""Network namespaces on a bridge the test creates and removes: one machine per node.

Only addresses given here are ever used: 10.213.N.0/24 on a bridge of this test's own.
`nsenter --net` switches the network namespace alone (`ip netns exec` would remount /sys and
hide the cgroup hierarchies the sandboxes need).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support import env_for


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Bridge:
    """A bridge with the host at .1 and `count` namespaces at .10, .11, ... on veth pairs."""

    def __init__(self, count: int) -> None:
        tag = f"sbf{os.getpid() % 10000}"
        self.subnet = f"10.213.{os.getpid() % 200 + 20}"
        self.bridge = f"{tag}br"
        self.host_ends = [f"{tag}h{i}" for i in range(count)]
        self.namespaces = [f"{tag}n{i}" for i in range(count)]
        self.addresses = [f"{self.subnet}.{10 + i}" for i in range(count)]

    def create(self) -> Bridge:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for ns, host_end, addr in zip(self.namespaces, self.host_ends, self.addresses, strict=True):
            ip("netns", "add", ns)
            ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("link", "set", host_end, "master", self.bridge, "up")
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        return self

    def link(self, i: int, up: bool) -> None:
        """Cut a namespace off (or reconnect it) by its link on the bridge."""
        ip("link", "set", self.host_ends[i], "up" if up else "down")

    def remove(self) -> None:
        for ns in self.namespaces:
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", ns)  # takes its veth pair along
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", self.bridge)


class NetnsNode:
    """A `sandbank serve` node inside a namespace, on its own address, port 8080."""

    def __init__(self, data: Path, ns: str, address: str, **overrides: Any) -> None:
        self.data = data
        self.ns = ns
        self.base_url = f"http://{address}:8080"
        self.address = address
        self.env = env_for(data, **overrides)
        self.log = data / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        argv = [
            "nsenter", f"--net=/run/netns/{self.ns}", "--",
            sys.executable, "-m", "sandbank.cli", "serve", "--host", self.address, "--port", "8080",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log)

    def wait_ready(self, timeout: float = 90) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited at start:\n{self.log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"node did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

"""What a sandbox needs to reach the egress proxy: a bound socket directory and its variables.

The sandbox keeps no interface but its loopback: the proxy's unix socket is bound in read-only,
and a relay inside (`sandbox/inside/sandbank_egress.py`) listens on 127.0.0.1:RELAY_PORT.
"""

from __future__ import annotations

from pathlib import Path

SOCKET_DIR_INSIDE = "/opt/sandbank/egress"
RELAY_PORT = 3128
# The session's own Python environment, where `pip install` puts packages (on the disk quota):
# made on first use, it sees the runtime image's packages, so only what is missing is installed.
SITE_DIR = "/workspace/.site"
INSIDE_BIN = "/opt/sandbank/lib/sandbank_inside/bin"  # the pip wrapper (bwrap.INSIDE_MOUNT/bin)


def pip_env(network: bool) -> dict[str, str]:
    """pip fails at once when it cannot reach an index (no retries against a closed door)."""
    env = {
        "PIP_RETRIES": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "SANDBANK_NETWORK": "proxy" if network else "none",
    }
    if network:
        env["SANDBANK_SITE"] = SITE_DIR
    return env


def proxy_env(socket_name: str) -> dict[str, str]:
    url = f"http://127.0.0.1:{RELAY_PORT}"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "no_proxy": "localhost,127.0.0.1,::1",
        "SANDBANK_EGRESS_SOCKET": f"{SOCKET_DIR_INSIDE}/{socket_name}",
        "SANDBANK_EGRESS_PORT": str(RELAY_PORT),
    }


def bwrap_binds(socket_dir: Path) -> list[str]:
    return ["--ro-bind", str(socket_dir), SOCKET_DIR_INSIDE]

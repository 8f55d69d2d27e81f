"""Inside the sandbox: the relay from 127.0.0.1:PORT to the egress proxy's unix socket.

Standard library only; imports nothing from the server. The sandbox has no network but its
own loopback, so HTTP clients (pip, requests, httpx, curl) are pointed by the usual proxy
variables at this relay, which passes bytes to the socket Sandbank bound in. The proxy outside
decides what may pass; this relay decides nothing and trusts nothing.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the relay's own imports wait for the relay: the worker starts fast
    import asyncio

CHUNK = 256 * 1024
LIMIT = 1024 * 1024
_UNREACHABLE = (
    b"HTTP/1.1 502 Sandbank egress proxy unreachable\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


relay: object = None  # the relay's process, kept so it is not reported as leaked


def site_packages(root: str) -> str:
    return f"{root}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"


def start() -> None:
    """Called once by the worker at start: put the session's site on the path, start the relay."""
    root = os.environ.get("SANDBANK_SITE")
    if root:
        # Before the runtime's own packages, for this interpreter and every child (bash, python3).
        site = site_packages(root)
        at = next((i for i, p in enumerate(sys.path) if p.endswith("site-packages")), len(sys.path))
        sys.path.insert(at, site)
        os.environ["PYTHONPATH"] = ":".join(filter(None, [os.environ.get("PYTHONPATH"), site]))
        sys.meta_path.append(FreshSite(site))
    path, port = os.environ.get("SANDBANK_EGRESS_SOCKET"), os.environ.get("SANDBANK_EGRESS_PORT")
    if not path or not port:
        return
    import socket
    import subprocess

    # Bound here, so the port is ready before any user code runs; served by a child process of
    # its own session, out of reach of the worker's interrupts and of the user's GIL.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(port)))
    listener.listen(128)
    fd = listener.fileno()
    global relay
    relay = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(fd), path],
        pass_fds=[fd],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listener.close()


def make_site() -> None:
    """The session's environment for pip, made on first use (by the pip wrapper).

    A venv of its own (so pip installs there, and never touches the read-only runtime image)
    whose path also holds the runtime's packages (so only what is missing is installed, and an
    upgrade shadows the runtime's copy instead of trying to uninstall it).
    """
    import site
    import venv

    root = os.environ["SANDBANK_SITE"]
    venv.create(root, with_pip=False, symlinks=True)
    with open(os.path.join(site_packages(root), "_sandbank_runtime.pth"), "w") as f:
        f.write("\n".join(p for p in site.getsitepackages() if os.path.isdir(p)) + "\n")


class FreshSite:
    """Last on sys.meta_path: what `pip install` just put in the site directory imports at once.

    The directory may not exist when the interpreter first looks (it is made on first use), and
    its cached listing is keyed on its mtime, which a small ext4 keeps in whole seconds. Only
    imports that every other finder missed get here; each costs one directory listing.
    """

    def __init__(self, site: str) -> None:
        self.site = site

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None:
            return None
        sys.path_importer_cache.pop(self.site, None)
        return importlib.machinery.PathFinder.find_spec(name, [self.site])


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()


async def _relay(path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    import asyncio

    try:
        up_reader, up_writer = await asyncio.open_unix_connection(path, limit=LIMIT)
    except OSError:
        writer.write(_UNREACHABLE)
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        up_writer.close()
        writer.close()


async def _serve(fd: int, path: str) -> None:
    import asyncio
    import socket

    listener = socket.socket(fileno=fd)
    server = await asyncio.start_server(lambda r, w: _relay(path, r, w), sock=listener, limit=LIMIT)
    async with server:
        await server.serve_forever()


def explain() -> str:
    """Why pip (or anything) may not reach the network: this session's policy, in a line."""
    if os.environ.get("SANDBANK_NETWORK") != "proxy":
        policy = "network policy: none"
    else:
        import http.client

        try:
            conn = http.client.HTTPConnection("127.0.0.1", int(os.environ["SANDBANK_EGRESS_PORT"]))
            conn.request("GET", "http://policy.sandbank.invalid/")
            policy = conn.getresponse().read(4096).decode("ascii", "replace").strip()
        except (OSError, KeyError, ValueError, http.client.HTTPException):
            return "[sandbank] the egress proxy did not answer"
    if policy == "network policy: none":
        return (
            "[sandbank] this session's network policy is none (no network): pip can install "
            "only local files"
        )
    return f"[sandbank] this session's {policy}; the package index must be on it"


if __name__ == "__main__":
    if sys.argv[1:] == ["explain"]:
        print(explain(), file=sys.stderr)
    elif sys.argv[1:] == ["site"]:
        make_site()
    else:
        import asyncio

        asyncio.run(_serve(int(sys.argv[1]), sys.argv[2]))

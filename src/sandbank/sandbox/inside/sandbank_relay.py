"""Inside the sandbox: the relay from 127.0.0.1:PORT to the egress proxy's unix socket.

Standard library only; imports nothing from the server; run as its own process by
`sandbank_egress.start()` with the listening socket's descriptor. The sandbox has no network but
its own loopback, so HTTP clients (pip, requests, httpx, curl) are pointed by the usual proxy
variables at this relay, which passes bytes to the socket Sandbank bound in. The proxy outside
decides what may pass; this relay decides nothing and trusts nothing.

Each way of a connection is a thread moving bytes with splice(2), from socket to pipe to socket
inside the kernel: no Python buffer touches them, and the threads wait in the kernel with the
GIL released, so the relay costs the sandbox's CPU share almost nothing beside its client.
A half-close passes through (the client may finish sending and still read); when the proxy's
side ends, the connection is over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import threading
import time

PIPE_SIZE = 256 * 1024
F_SETPIPE_SZ = 1031
CONNECT_TIMEOUT = 10.0
_UNREACHABLE = (
    b"HTTP/1.1 502 Sandbank egress proxy unreachable\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


def one_way(src: socket.socket, dst: socket.socket) -> None:
    """Move bytes from `src` to `dst` until `src` ends; then pass the end on."""
    r, w = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_SIZE)
    try:
        while n := os.splice(src.fileno(), w, PIPE_SIZE):
            while n:
                n -= os.splice(r, dst.fileno(), n)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for s in (src, dst):  # one end failed: the other learns it at once
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
    finally:
        os.close(r)
        os.close(w)


def relay(client: socket.socket, path: str) -> None:
    """One connection: dial the proxy, then both ways at once; close both when both are done."""
    with client:
        proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with proxy:
            proxy.settimeout(CONNECT_TIMEOUT)
            try:
                proxy.connect(path)
            except OSError:
                with contextlib.suppress(OSError):
                    client.sendall(_UNREACHABLE)
                return
            proxy.settimeout(None)
            up = threading.Thread(target=one_way, args=(client, proxy), daemon=True)
            try:
                up.start()
            except RuntimeError:  # the sandbox's process limit: this connection is refused
                return
            one_way(proxy, client)
            # The proxy ended the connection: the client's side of it is over too.
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RD)
            up.join()


def serve(fd: int, path: str) -> None:
    listener = socket.socket(fileno=fd)
    # A connection reset before it was accepted, or no descriptor or thread left for one, is
    # never the relay's end; a pause, so a lasting shortage does not spin.
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            time.sleep(0.05)
            continue
        try:
            threading.Thread(target=relay, args=(client, path), daemon=True).start()
        except RuntimeError:
            client.close()
            time.sleep(0.05)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])

"""Inside the sandbox, with egress on: the session's site directory, and starting the relay.

Standard library only; imports nothing from the server. Imported by the worker at its start
(kept light), and run by the pip wrapper (`site`: make the session's environment; `explain`:
say what the session's network policy allows). The relay itself is `sandbank_relay.py`.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

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
        [
            sys.executable,
            "-I",
            "-S",
            os.path.join(os.path.dirname(__file__), "sandbank_relay.py"),
            str(fd),
            path,
        ],
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
            "only local files; packages are installed by the server's operator "
            '(make install SANDBANK_EXTRA_PACKAGES="name ...")'
        )
    return f"[sandbank] this session's {policy}; the package index must be on it"


if __name__ == "__main__":
    if sys.argv[1:] == ["explain"]:
        print(explain(), file=sys.stderr)
    elif sys.argv[1:] == ["site"]:
        make_site()
    else:
        raise SystemExit(f"usage: {sys.argv[0]} explain|site")

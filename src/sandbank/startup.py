"""Checks made before the server starts, with the fix in one line; and the start-up summary."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
import tempfile
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

from .config import Settings
from .errors import ConfigError
from .store.lockfile import ServeLock

SUGGESTED_DATA_DIR = "/var/lib/sandbank"


def version() -> str:
    try:
        return metadata.version("sandbank")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def check_data_dir(settings: Settings, create: bool = True) -> None:
    """`ConfigError` saying what to do when the data directory cannot serve; creates it."""
    path = Path(os.path.abspath(settings.data_dir))
    name = f"SANDBANK_DATA_DIR={path}"
    for part in [*reversed(path.parents), path]:
        if part.exists() and not part.is_dir():
            if part == path:
                raise ConfigError(
                    f"{name} is a file, not a directory: choose a directory "
                    f"(e.g. {SUGGESTED_DATA_DIR})"
                )
            raise ConfigError(
                f"{name} cannot be created: {part} is a regular file; choose another path "
                f"(e.g. {SUGGESTED_DATA_DIR})"
            )
    if settings.isolation != "none" and settings.role != "front":
        # Sandbox users (uids of their own) must traverse every directory above their workspace;
        # the data directory itself is opened up by the server.
        for part in reversed(path.parents):
            if part.exists() and os.stat(part).st_mode & stat.S_IXOTH == 0:
                if part == Path("/root") or part.parent == Path("/home"):
                    raise ConfigError(
                        f"{name} is under {part}, a home directory that sandbox users cannot "
                        f"reach: use a directory outside it, such as {SUGGESTED_DATA_DIR}"
                    )
                raise ConfigError(
                    f"{name} is under {part}, which other users cannot traverse (mode "
                    f"{stat.S_IMODE(os.stat(part).st_mode):o}), so sandbox users cannot reach "
                    f"their workspaces: use a directory such as {SUGGESTED_DATA_DIR}, or "
                    f"`chmod o+x {part}`"
                )
    if not create:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ConfigError(
            f"{name} is not writable ({error.strerror}): choose a writable directory "
            f"(e.g. {SUGGESTED_DATA_DIR}) or fix its permissions"
        ) from None


def providers() -> list[str]:
    from any_llm import LLMProvider

    return sorted(p.value for p in LLMProvider)


def check_model(settings: Settings) -> None:
    """`ConfigError` when SANDBANK_LLM_MODEL is malformed or names a provider any-llm lacks."""
    spec = settings.llm_model.strip()
    if not spec:
        return
    provider, _, model = spec.partition(":")
    if not provider or not model:
        raise ConfigError(
            f"SANDBANK_LLM_MODEL={spec} is not valid: expected provider:model "
            "(e.g. openai:gpt-4.1-mini)"
        )
    known = providers()
    if provider not in known:
        raise ConfigError(
            f"SANDBANK_LLM_MODEL={spec} names an unknown provider {provider!r}: expected one "
            f"of {', '.join(known)}"
        )


def check_tokens(settings: Settings) -> None:
    from .http.auth import load_tokens

    try:
        load_tokens(settings)
    except OSError as error:
        raise ConfigError(
            f"SANDBANK_EXEC_TOKENS_FILE={settings.exec_tokens_file} cannot be read "
            f"({error.strerror}): expected a readable file of tokens, one per line"
        ) from None


def check_isolation(settings: Settings) -> None:
    """bubblewrap, cgroups, root, the runtime image: before listening, not in a traceback."""
    if settings.isolation == "none":
        return  # the unisolated mode warns loudly when the runtime starts
    from .sandbox.backends import backend_for

    backend_for(settings).check()  # raises IsolationUnavailable, a ConfigError


def check_database(settings: Settings) -> None:
    """A database server that cannot be reached (PostgreSQL): one line, before listening."""
    url = settings.database_url.get_secret_value()
    if settings.interpreter_api != "on" or not url.startswith("postgresql"):
        return  # SQLite is a file in a checked directory; memory:// needs nothing
    import sqlalchemy as sa
    from sqlalchemy.exc import SQLAlchemyError

    engine = sa.create_engine(url, pool_pre_ping=False)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as error:
        raise ConfigError(
            f"SANDBANK_DATABASE_URL: cannot connect to {database_kind(settings)} "
            f"({type(getattr(error, 'orig', None) or error).__name__}): check the URL and that "
            "the server runs"
        ) from None
    finally:
        engine.dispose()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings, tokens: list[str]) -> list[str]:
    """`ConfigError` for a server that would answer anyone beyond loopback without credentials
    (an unauthenticated code-execution API is remote code execution for whoever reaches it),
    unless SANDBANK_ALLOW_UNAUTHENTICATED says it is meant; then the warnings to log."""
    from .http.proxies import parse_networks

    open_doors: list[str] = []
    if settings.role != "node" and settings.exec_api != "off" and not tokens:
        host = settings.exec_api_host if settings.exec_api == "separate" else settings.host
        if not is_loopback(host):
            open_doors.append(f"the code-execution API on {host} without SANDBANK_EXEC_TOKENS")
    if (
        settings.role != "node"
        and settings.interpreter_api == "on"
        and settings.trusted_user_header.strip()
        and not is_loopback(settings.host)
        and any(n.prefixlen == 0 for n in parse_networks(settings.trusted_proxies))
    ):
        open_doors.append(
            f"the interpreter API on {settings.host} believing "
            f"{settings.trusted_user_header.strip()} from any address "
            f"(SANDBANK_TRUSTED_PROXIES={settings.trusted_proxies})"
        )
    if not open_doors:
        return []
    if settings.allow_unauthenticated:
        return [
            f"serving {door}: anyone who reaches it is let in (SANDBANK_ALLOW_UNAUTHENTICATED=1)"
            for door in open_doors
        ]
    raise ConfigError(
        f"refusing to serve {' and '.join(open_doors)}: anyone who reaches it could run code "
        "or act as any user. Set SANDBANK_EXEC_TOKENS (or SANDBANK_EXEC_TOKENS_FILE) and name "
        "your proxies' addresses in SANDBANK_TRUSTED_PROXIES, listen on 127.0.0.1, or, if only "
        "trusted clients can reach this address, set SANDBANK_ALLOW_UNAUTHENTICATED=1"
    )


def own_data_dir(settings: Settings) -> ServeLock:
    """Take the data directory for this server, before anything in it is touched; a
    `ConfigError` naming the holder when another server has it."""
    path = Path(os.path.abspath(settings.data_dir))
    lock = ServeLock.of_data_dir(path)
    holder = lock.acquire()
    if holder is not None:
        raise ConfigError(
            f"SANDBANK_DATA_DIR={path} is served by another sandbank server ({holder}): stop "
            "it, or give this one a data directory of its own"
        )
    return lock


def check(settings: Settings) -> None:
    """Everything checked before `serve` builds anything."""
    check_model(settings)
    check_data_dir(settings)
    check_tokens(settings)
    from .http.auth import load_tokens

    check_exposure(settings, [] if settings.role == "node" else load_tokens(settings))
    if settings.role != "front":  # a front holds no sandbox: it runs as any user
        check_isolation(settings)
    check_database(settings)


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` for uvicorn; `ConfigError` in one line when it cannot be."""
    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    # IPPROTO_TCP named, as getaddrinfo gives it: asyncio sets TCP_NODELAY on the connections
    # it accepts only for such a socket (with proto 0, every keep-alive answer written in two
    # parts waited ~40 ms for the client's delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as error:
        sock.close()
        where = f"{host}:{port}"
        if error.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{where} is already in use (another sandbank server, or another program): "
                "stop it, or choose another port with --port or SANDBANK_PORT"
            ) from None
        if error.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(
                f"cannot listen on {where}: {host} is not an address of this machine; "
                "use 127.0.0.1, 0.0.0.0 or one of its addresses (--host or SANDBANK_HOST)"
            ) from None
        if error.errno == errno.EACCES:
            raise ConfigError(
                f"cannot listen on {where}: ports below 1024 need privileges; choose another "
                "port with --port or SANDBANK_PORT"
            ) from None
        raise ConfigError(f"cannot listen on {where}: {error.strerror}") from None
    except socket.gaierror as error:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock


def database_kind(settings: Settings) -> str:
    url = settings.database_url.get_secret_value()
    if not url:
        return f"sqlite ({Path(os.path.abspath(settings.data_dir)) / 'sandbank.db'})"
    if url == "memory://":
        return "memory"
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    if scheme == "sqlite":
        return f"sqlite ({url.partition(':///')[2]})"
    where = parts.hostname or "local socket"
    if parts.port:
        where += f":{parts.port}"
    return f"{scheme} ({where}{parts.path})"  # never the user name or password


def storage_kind(settings: Settings) -> str:
    url = settings.storage_url.strip()
    if not url:
        return f"local ({Path(os.path.abspath(settings.data_dir)) / 'objects'})"
    if url.startswith("s3://"):
        endpoint = without_credentials(settings.s3_endpoint_url) or "AWS"
        return f"s3 ({url}, endpoint {endpoint})"
    return urlsplit(url).scheme or url


def without_credentials(url: str) -> str:
    """A URL fit for a log line: any `user:password@` is dropped."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return parts._replace(netloc=host).geturl()


def role_name(settings: Settings) -> str:
    """What this process is, in the README's words."""
    if settings.role == "node":
        from .fleet.node import node_name

        return f"fleet node {node_name(settings)}"
    if settings.role == "front":
        nodes = settings.fleet_dns or settings.fleet_nodes
        return f"fleet front (nodes: {without_credentials(nodes)})"
    if settings.interpreter_api == "on" and database_kind(settings).startswith("postgresql"):
        return "replica (interpreter API on a shared PostgreSQL)"
    return "single server"


def serving(settings: Settings, tokens: int) -> list[str]:
    """What is on, and behind which credential (never the credential itself)."""
    s = settings
    if s.role == "node":
        on = ["the code-execution API for the fleet's fronts (fleet token)"]
        # Durable isolations keep snapshots (backends' `durable`): fleet/moves.py moves them.
        if s.pause_on_shutdown and s.isolation in ("fork", "bwrap"):
            on.append(f"sessions moved at a drain through {storage_kind(s)}")
        return on
    if tokens:
        auth = f"{tokens} token(s)"
    elif s.allow_unauthenticated:
        auth = "NO AUTHENTICATION: SANDBANK_ALLOW_UNAUTHENTICATED"
    else:
        auth = "no tokens: loopback only"
    on = []
    if s.exec_api == "on":
        on.append(f"the code-execution API at / ({auth})")
    elif s.exec_api == "separate":
        on.append(f"the code-execution API on http://{s.exec_api_host}:{s.exec_api_port} ({auth})")
    if s.interpreter_api == "on":
        who = (
            f", or {s.trusted_user_header.strip()} from a trusted proxy"
            if (s.trusted_user_header.strip())
            else ""
        )
        on.append(f"the interpreter API at /api (API keys{who})")
        if s.web_ui == "on":
            on.append("the web page at /")
    on.append("metrics at /metrics")
    if s.admin_token.get_secret_value():
        on.append("/admin/sessions")
    return on


def summary(settings: Settings, tokens: int = 0) -> str:
    """One line an operator reads at start: what runs, where, on what (no secret)."""
    s = settings
    address = f"http://{s.host}:{s.port}"
    parts = [f"sandbank {version()}: {role_name(s)} on {address}"]
    parts.append("serving " + ", ".join(serving(s, tokens)))
    if s.role != "front":
        offered = s.isolations()
        parts.append(
            f"isolation {offered[0]}"
            + (f" (also offered: {', '.join(offered[1:])})" if offered[1:] else "")
        )
    parts.append(f"data dir {os.path.abspath(s.data_dir)}")
    if s.role != "node" and s.interpreter_api == "on":
        model = s.llm_model or "off"
        if s.llm_model and s.llm_base_url:
            model += f" at {without_credentials(s.llm_base_url)}"
        parts += [f"database {database_kind(s)}", f"storage {storage_kind(s)}", f"model {model}"]
    if s.role != "front":
        parts.append(
            f"pool size {s.pool_size} (up to {s.pool_size_max} after bursts); "
            f"max sessions {s.max_sessions}"
        )
    return "; ".join(parts)

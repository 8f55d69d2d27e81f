"""Checks made before the server starts, with the fix in one line; and the start-up summary."""

from __future__ import annotations

import os
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
    if settings.isolation != "none":
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
    check_isolation(settings)
    check_database(settings)


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


def summary(settings: Settings) -> str:
    """One line an operator reads at start: what runs, where, on what (no secret)."""
    s = settings
    address = f"http://{s.host}:{s.port}"
    if s.exec_api == "separate":
        address += f" (code-execution API on http://{s.exec_api_host}:{s.exec_api_port})"
    model = s.llm_model or "off"
    if s.llm_model and s.llm_base_url:
        model += f" at {without_credentials(s.llm_base_url)}"
    return (
        f"sandbank {version()} on {address}; isolation {s.isolation}; data dir "
        f"{os.path.abspath(s.data_dir)}; database {database_kind(s)}; storage "
        f"{storage_kind(s)}; model {model}; pool size {s.pool_size}; max sessions "
        f"{s.max_sessions}"
    )

"""The `sandbank` command: `serve`, `doctor`, `exec`, and the few admin commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from .config import Settings, check_variables, load_settings
from .errors import ConfigError, SandbankError

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("sandbank")
# Names people type and proxies send: no slash (they appear in paths and URLs), no blank.
USER_NAME = re.compile(r"[^\s/\\\x00-\x1f\x7f]{1,128}")
TITLE_CHARS = 48


def _warn(text: str) -> None:
    print(f"sandbank: warning: {text}", file=sys.stderr)


def _settings(
    args: argparse.Namespace,
    uses_data_dir: bool = True,
    warn: Callable[[str], None] = _warn,
) -> Settings:
    """The settings, command-line values first; an unknown `SANDBANK_*` variable stops every
    command (a misspelt one must never be silently ignored)."""
    overrides: dict[str, Any] = {}
    for key in ("host", "port", "data_dir"):
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    check_variables()
    settings = load_settings(**overrides)
    if uses_data_dir and "data_dir" not in settings.model_fields_set:
        warn(
            f"no --data-dir or SANDBANK_DATA_DIR given: using {os.path.abspath(settings.data_dir)}"
        )
    return settings


def serve(args: argparse.Namespace) -> int:
    from . import logs, startup
    from .serving import run

    warnings: list[str] = []
    settings = _settings(args, warn=warnings.append)
    logs.setup(settings)  # first: what the checks log is in the log's format (JSON, perhaps)
    for warning in warnings:
        log.warning("%s", warning)
    owner = startup.own_data_dir(settings)  # before anything of the directory is touched
    try:
        startup.check(settings)
        from .http.auth import load_tokens

        tokens = 0 if settings.role == "node" else len(load_tokens(settings))
        return run(settings, announce=startup.summary(settings, tokens))
    finally:
        owner.release()


def mcp(args: argparse.Namespace) -> int:
    """MCP over stdio: this machine's sandboxes in-process, or a running server's (`--url`)."""
    from . import logs, startup
    from .mcp.stdio import run

    url = args.url
    warnings: list[str] = []
    settings = _settings(args, uses_data_dir=url is None, warn=warnings.append)
    if url is not None:
        token = args.token or settings.sandbox_token.get_secret_value()
        settings = settings.model_copy(update={"sandbox_token": SecretStr(token or "")})
    logs.setup(settings)  # to stderr: stdout carries the protocol
    for warning in warnings:
        log.warning("%s", warning)
    if url is None:
        startup.check_data_dir(settings)
        startup.check_isolation(settings)
    return run(settings, url)


def doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks

    settings = _settings(args)
    if args.attack:
        from .attack import run_attack

        return run_attack(settings, settings.isolations(), out=sys.stdout)
    return run_checks(settings, model=bool(args.model), out=sys.stdout)


def _admin(args: argparse.Namespace, action: Callable[[Store, Settings], Awaitable[None]]) -> int:
    """Run one admin action on the store the settings name (safe while a server runs)."""
    from .store import open_store

    settings = _settings(args)

    async def run() -> None:
        store = await asyncio.to_thread(open_store, settings)
        try:
            await action(store, settings)
        finally:
            await store.close()

    asyncio.run(run())
    return 0


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def valid_user_name(name: str) -> str:
    if not USER_NAME.fullmatch(name):
        raise SandbankError(
            f"user name {name!r} is not valid: expected 1 to 128 characters, no spaces, "
            "slashes or control characters"
        )
    return name


def users_create(args: argparse.Namespace) -> int:
    name = valid_user_name(args.name)

    async def action(store: Store, settings: Settings) -> None:
        user = await store.accounts.create_user(name)
        _, secret = await store.accounts.create_key(user.name)
        print(f"created user {user.name} ({user.id}); their API key (shown once):")
        print(secret)

    return _admin(args, action)


async def _users(store: Store) -> list[tuple[str, str, float]]:
    """(name, id, created) of every user. Each user is created with a key, and keys are only
    removed with their user, so the keys name every user."""
    seen: dict[str, tuple[str, str, float]] = {}
    for key in await store.accounts.list_keys():
        if key.user_name not in seen:
            user = await store.accounts.get_user(key.user_name)
            if user is not None:
                seen[user.name] = (user.name, user.id, user.created_at)
    return sorted(seen.values(), key=lambda u: u[2])


def users_list(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        users = await _users(store)
        keys = await store.accounts.list_keys()
        rows = []
        for name, user_id, created in users:
            active = sum(1 for k in keys if k.user_name == name and not k.revoked)
            rows.append([name, user_id, _when(created), str(active)])
        _table(["NAME", "ID", "CREATED", "ACTIVE_KEYS"], rows)

    return _admin(args, action)


def users_delete(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        from .files import open_object_store, session_prefix

        session_ids = await store.accounts.delete_user(args.name)
        objects = open_object_store(settings)
        try:
            for session_id in session_ids:
                await objects.delete_prefix(session_prefix(session_id))
        finally:
            await objects.close()
        print(
            f"deleted user {args.name}, their keys and {len(session_ids)} session(s) with their "
            "messages and files; a running server ends their sandboxes at its idle timeout"
        )

    return _admin(args, action)


def keys_create(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        key, secret = await store.accounts.create_key(args.name)
        print(f"created key {key.id} for {key.user_name}; the key (shown once):")
        print(secret)

    return _admin(args, action)


def keys_list(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        rows = []
        for key in await store.accounts.list_keys(args.name):
            state = f"revoked {_when(key.revoked_at)}" if key.revoked else "active"
            used = "never" if key.last_used_at is None else _when(key.last_used_at)
            rows.append([key.id, key.user_name, _when(key.created_at), used, state])
        _table(["KEY_ID", "USER", "CREATED", "LAST_USED", "STATE"], rows)

    return _admin(args, action)


def keys_revoke(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        await store.accounts.revoke_key(args.key_id)
        print(f"revoked key {args.key_id}")

    return _admin(args, action)


def title_of(question: str) -> str:
    """A session's title: its first question on one line, shortened."""
    text = " ".join(question.split())
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1].rstrip() + "…"


def exec_sessions_list(args: argparse.Namespace) -> int:
    from .terminal import exec_sessions

    settings = _settings(args, uses_data_dir=False)
    rows = [
        [
            s["session"] + "…",
            s["tenant"],
            _when(s["created_at"]),
            s["state"],
            f"{s['idle_seconds']:g} s",
        ]
        for s in exec_sessions(settings, args.url, args.token)
    ]
    _table(["SESSION", "TENANT", "CREATED", "STATE", "IDLE"], rows)
    return 0


def sessions_list(args: argparse.Namespace) -> int:
    if args.exec:
        return exec_sessions_list(args)

    async def action(store: Store, settings: Settings) -> None:
        rows = []
        for name, user_id, _ in await _users(store):
            if args.name and name != args.name:
                continue
            for session in await store.chats.of_user(user_id):
                first = session.title or ""  # its given name, else its first question
                rows.append(
                    (
                        session.created_at,
                        [
                            session.id,
                            name,
                            _when(session.created_at),
                            session.status,
                            title_of(first) or "(no question yet)",
                        ],
                    )
                )
        rows.sort(key=lambda r: r[0], reverse=True)
        _table(["SESSION_ID", "USER", "CREATED", "STATUS", "TITLE"], [r[1] for r in rows])

    return _admin(args, action)


def exec_(args: argparse.Namespace) -> int:
    from .terminal import run_in_sandbox

    settings = _settings(args, uses_data_dir=False)
    if args.code is not None:
        tool, text = "code_execution", args.code
    elif args.bash is not None:
        tool, text = "bash_code_execution", args.bash
    else:
        source = sys.stdin if args.file in (None, "-") else open(args.file)  # noqa: SIM115
        with source:
            tool, text = "code_execution", source.read()
    return run_in_sandbox(
        settings,
        url=args.url,
        token=args.token,
        session=args.session,
        keep=args.keep,
        tool=tool,
        text=text,
        timeout=args.timeout,
    )


def _parser() -> argparse.ArgumentParser:
    from .startup import version

    parser = argparse.ArgumentParser(prog="sandbank", description=__doc__)
    parser.add_argument("--version", action="version", version=f"sandbank {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def data_dir_option(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument(
            "--data-dir",
            type=Path,
            help="where state lives (sets SANDBANK_DATA_DIR; default ./sandbank-data)",
        )

    p = sub.add_parser("serve", help="run the server")
    p.add_argument("--host", help="address to listen on (sets SANDBANK_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (sets SANDBANK_PORT; default 8080)")
    data_dir_option(p)
    p.set_defaults(func=serve)

    p = sub.add_parser(
        "mcp",
        help="serve the sandboxes to an MCP client over stdio (a desktop client starts it)",
        description="Serve Sandbank's MCP tools over stdin/stdout: this machine's sandboxes in "
        "this process (as `serve` makes them, so as root for real isolation), or with --url "
        "those of a running server, through its code-execution API (no privilege needed).",
    )
    data_dir_option(p)
    p.add_argument(
        "--url", help="a running server's code-execution API, e.g. http://127.0.0.1:8080"
    )
    p.add_argument(
        "--token", help="its bearer token (default SANDBANK_SANDBOX_TOKEN; with --url only)"
    )
    p.set_defaults(func=mcp)

    p = sub.add_parser("doctor", help="check this machine and the settings; exit 1 on a failure")
    data_dir_option(p)
    p.add_argument(
        "--model",
        action="store_true",
        help="also send the model a one-token request (costs a request on paid providers)",
    )
    p.add_argument(
        "--attack",
        action="store_true",
        help="instead of the checks: run the escape battery in a real sandbox of the "
        "isolation; exit 1 when any attempt succeeds",
    )
    p.set_defaults(func=doctor)

    p = sub.add_parser(
        "exec",
        help="run code or a command in a sandbox of a running server; exits with its return code",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("-c", "--code", help="Python code to run")
    what.add_argument("-b", "--bash", help="a bash command to run")
    what.add_argument("file", nargs="?", help="a Python file to run ('-' or nothing: stdin)")
    p.add_argument(
        "--url", help="the server's code-execution API (default http://SANDBANK_HOST:PORT)"
    )
    p.add_argument(
        "--token",
        help="bearer token (default: the first of SANDBANK_EXEC_TOKENS)",
    )
    p.add_argument("--session", help="run in this existing session (it is kept)")
    p.add_argument(
        "--keep", action="store_true", help="keep the new session and print its id on stderr"
    )
    p.add_argument("--timeout", type=int, help="timeout of the call (seconds)")
    p.set_defaults(func=exec_)

    def admin(parent: Any, name: str, helptext: str, func: Any) -> argparse.ArgumentParser:
        cmd: argparse.ArgumentParser = parent.add_parser(name, help=helptext)
        data_dir_option(cmd)
        cmd.set_defaults(func=func)
        return cmd

    users = sub.add_parser("users", help="manage interpreter API users").add_subparsers(
        dest="action", required=True
    )
    admin(users, "create", "create a user; prints their API key last", users_create).add_argument(
        "name"
    )
    admin(users, "list", "list users", users_list)
    admin(users, "delete", "delete a user and all they own", users_delete).add_argument("name")
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(
        dest="action", required=True
    )
    admin(keys, "create", "add a key for a user; prints it last", keys_create).add_argument("name")
    admin(keys, "list", "list keys (never secrets)", keys_list).add_argument("name", nargs="?")
    admin(keys, "revoke", "revoke a key by id", keys_revoke).add_argument("key_id")
    sessions = sub.add_parser(
        "sessions", help="interpreter sessions, or a running server's code-execution sessions"
    ).add_subparsers(dest="action", required=True)
    listing = admin(sessions, "list", "list sessions, newest first", sessions_list)
    listing.add_argument("name", nargs="?", help="only this user's (interpreter sessions)")
    listing.add_argument(
        "--exec",
        action="store_true",
        help="the code-execution sessions a running server holds (needs SANDBANK_ADMIN_TOKEN)",
    )
    listing.add_argument("--url", help="the server (default http://SANDBANK_HOST:PORT)")
    listing.add_argument("--token", help="its admin token (default SANDBANK_ADMIN_TOKEN)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except ConfigError as e:
        print(f"sandbank: {e.message}", file=sys.stderr)
        return 2
    except SandbankError as e:
        print(f"sandbank: {e.message}", file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())

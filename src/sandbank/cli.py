"""The `sandbank` command: `serve`, and the few admin commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import Settings

if TYPE_CHECKING:
    from .store import Store


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for key in ("host", "port", "data_dir"):
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    return Settings(**overrides)


def serve(args: argparse.Namespace) -> int:
    from .errors import SandbankError
    from .serving import run

    settings = _settings(args)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run(settings)
    except SandbankError as e:
        print(f"sandbank: {e.message}", file=sys.stderr)
        return 2


def _admin(args: argparse.Namespace, action: Callable[[Store, Settings], Awaitable[None]]) -> int:
    """Run one admin action on the store the settings name (safe while a server runs)."""
    from .errors import SandbankError
    from .store import open_store

    settings = _settings(args)

    async def run() -> None:
        store = await open_store(settings)
        try:
            await action(store, settings)
        finally:
            await store.close()

    try:
        asyncio.run(run())
    except SandbankError as e:
        print(f"sandbank: {e.message}", file=sys.stderr)
        return 1
    return 0


def users_create(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        user = await store.create_user(args.name)
        _, secret = await store.create_key(user.name)
        print(f"created user {user.name} ({user.id}); their API key (shown once):")
        print(secret)

    return _admin(args, action)


def users_delete(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        from .files import open_object_store, session_prefix

        session_ids = await store.delete_user(args.name)
        objects = await open_object_store(settings)
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
        key, secret = await store.create_key(args.name)
        print(f"created key {key.id} for {key.user_name}; the key (shown once):")
        print(secret)

    return _admin(args, action)


def keys_list(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        for key in await store.list_keys(args.name):
            state = "revoked" if key.revoked else "active"
            print(f"{key.id}\t{key.user_name}\t{state}")

    return _admin(args, action)


def keys_revoke(args: argparse.Namespace) -> int:
    async def action(store: Store, settings: Settings) -> None:
        await store.revoke_key(args.key_id)
        print(f"revoked key {args.key_id}")

    return _admin(args, action)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandbank", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the server")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--data-dir", type=Path)
    p.set_defaults(func=serve)

    def admin(parent: Any, name: str, helptext: str, func: Any) -> argparse.ArgumentParser:
        cmd: argparse.ArgumentParser = parent.add_parser(name, help=helptext)
        cmd.add_argument("--data-dir", type=Path)
        cmd.set_defaults(func=func)
        return cmd

    users = sub.add_parser("users", help="manage interpreter API users").add_subparsers(
        dest="action", required=True
    )
    admin(users, "create", "create a user; prints their API key last", users_create).add_argument(
        "name"
    )
    admin(users, "delete", "delete a user and all they own", users_delete).add_argument("name")
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(
        dest="action", required=True
    )
    admin(keys, "create", "add a key for a user; prints it last", keys_create).add_argument("name")
    admin(keys, "list", "list key ids (never secrets)", keys_list).add_argument("name", nargs="?")
    admin(keys, "revoke", "revoke a key by id", keys_revoke).add_argument("key_id")
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

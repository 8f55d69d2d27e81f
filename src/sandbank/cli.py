"""The `sandbank` command: `serve`, and the few admin commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from .config import Settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for key in ("host", "port", "data_dir"):
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    return Settings(**overrides)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import create_app
    from .errors import SandbankError

    settings = _settings(args)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        app = create_app(settings)
    except SandbankError as e:
        print(f"sandbank: {e.message}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=30,
    )
    server = Server(config)
    server.parts = app.state.parts
    try:
        server.run()
    except SandbankError as e:
        print(f"sandbank: {e.message}", file=sys.stderr)
        return 2
    return 0 if server.started else 1


class Server:
    """uvicorn's server; on SIGTERM it first ends running calls (with a result), then stops."""

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class _Server(uvicorn.Server):
            parts: Any = None

            def handle_exit(self, sig: int, frame: Any) -> None:
                if self.parts is not None and not self.should_exit:
                    # Destroying the sessions answers in-flight calls, so uvicorn's graceful
                    # wait for open requests ends promptly.
                    asyncio.get_event_loop().create_task(self.parts.runtime.shutdown())
                super().handle_exit(sig, frame)

        return _Server(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandbank", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the server")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--data-dir", type=Path)
    p.set_defaults(func=serve)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

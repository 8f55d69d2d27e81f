"""`sandbank mcp`: the MCP door over stdin and stdout, for a desktop client to start.

Over this machine's own sandboxes, in this process (as `sandbank serve` makes them: root for
real isolation), or over a running server's code-execution API with `--url` (no privilege
needed here; that server isolates and its token is the tenant). Logs go to stderr: stdout is the
protocol's.
"""

from __future__ import annotations

import asyncio
import logging

from mcp.server.stdio import stdio_server

from ..config import Settings
from ..sandbox.port import Sandboxes
from .door import McpDoor

log = logging.getLogger(__name__)


def sandboxes_for(settings: Settings, url: str | None) -> Sandboxes:
    if url:
        from ..sandbox.remote import RemoteSandboxes

        return RemoteSandboxes(settings.model_copy(update={"sandbox_url": url}))
    from ..metrics import Metrics, SandboxHooks
    from ..sandbox.local import LocalSandboxes

    return LocalSandboxes(settings, hooks=SandboxHooks(Metrics()))


async def serve(settings: Settings, url: str | None) -> None:
    sandboxes = sandboxes_for(settings, url)
    door = McpDoor(sandboxes, settings)
    # The transport first: it points fds 0 and 1 away from the wire, so nothing the sandboxes
    # start (a fork template, say) can write into the protocol.
    async with stdio_server() as (read_stream, write_stream):
        await sandboxes.start()
        try:
            log.info("serving MCP on stdio over %s", url or "this machine's sandboxes")
            await door.server.run(
                read_stream, write_stream, door.server.create_initialization_options()
            )
        finally:
            await sandboxes.close()


def run(settings: Settings, url: str | None) -> int:
    asyncio.run(serve(settings, url))
    return 0

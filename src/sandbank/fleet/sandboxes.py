"""The interpreter's sandboxes on a front: the protocol client, routed in-process over the fleet."""

from __future__ import annotations

import httpx
from pydantic import SecretStr
from starlette.applications import Starlette

from ..config import Settings
from ..http import EXCEPTION_HANDLERS
from ..leasing.remote import RemoteSandboxes
from .front import Fleet, FrontApi

# The interpreter's sandboxes are a tenant of their own, apart from every exec-API token.
INTERPRETER_TENANT = "interpreter"


class FleetSandboxes(RemoteSandboxes):
    """`RemoteSandboxes` whose requests go through this front's router, with no socket.

    A lost node answers 404 like an unknown session, so a chat's next turn leases a new sandbox,
    places its files again and tells the agent (interpreter/runs.py `_lease`).
    """

    def __init__(self, settings: Settings, fleet: Fleet) -> None:
        api = FrontApi(fleet, lambda _authorization: INTERPRETER_TENANT)
        app = Starlette(routes=api.routes(), exception_handlers=EXCEPTION_HANDLERS)
        super().__init__(
            settings.model_copy(
                update={"sandbox_url": "http://fleet", "sandbox_token": SecretStr("")}
            ),
            transport=httpx.ASGITransport(app=app),
        )

    async def start(self) -> None:
        pass  # nodes are Sandbank nodes: they serve the file operations

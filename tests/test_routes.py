"""Every route a server serves is in one of its OpenAPI documents, whatever its role."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route

from sandbank.app import create_app, create_exec_app
from sandbank.execapi import openapi as exec_openapi
from sandbank.interpreter import openapi as interpreter_openapi
from tests.support import data_dir, settings

# The browser UI's own routes: the page, the settings it reads first and its static files.
# They are a web page, not an API (the reference page, /docs, is documented).
PAGE = {("/", "GET"), ("/ui/config.json", "GET"), ("/ui", "MOUNT")}
FLEET = {"fleet_token": "t" * 32, "fleet_nodes": "n1=http://127.0.0.1:9"}
CONFIGS: dict[str, dict[str, Any]] = {
    "all": {"admin_token": "a" * 32},
    "separate": {"exec_api": "separate", "admin_token": "a" * 32},
    "node": {"role": "node", **FLEET},
    "front": {"role": "front", **FLEET},
}


def served(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(path, method) of every route, mounts walked; a mount of a bare app is ('/x', MOUNT)."""
    for route in routes:
        if isinstance(route, Mount) and route.routes:
            yield from served(list(route.routes), prefix + route.path)
        elif isinstance(route, Mount):
            yield prefix + route.path, "MOUNT"
        elif isinstance(route, Route):
            for method in route.methods or ():
                if method not in ("HEAD", "OPTIONS"):
                    yield prefix + route.path, method


def documented() -> set[tuple[str, str]]:
    found = set()
    for doc in (exec_openapi.document(), interpreter_openapi.document()):
        for path, item in doc["paths"].items():
            found |= {(path, m.upper()) for m in item if m in ("get", "post", "put", "delete")}
    return found


@pytest.fixture(scope="module")
def data() -> Iterator[Path]:
    with data_dir() as path:
        yield path


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_route_served_is_documented(config: str, data: Path) -> None:
    configured = settings(data, **CONFIGS[config])
    app = create_app(configured)
    apps: list[Starlette] = [app]
    if configured.exec_api == "separate":
        apps.append(create_exec_app(app.state.services, configured))
    routes = {r for a in apps for r in served(a.routes)}
    assert routes - documented() - PAGE == set()
    assert ("/metrics", "GET") in routes  # the walk sees the routes added last


def test_the_walk_finds_a_route_that_is_not_documented() -> None:
    extra: list[BaseRoute] = [
        Mount("/api", routes=[Route("/sessions/{session_id}/secret", lambda r: None)])
    ]
    assert set(served(extra)) - documented() == {("/api/sessions/{session_id}/secret", "GET")}

"""Every route a server serves is in one of its OpenAPI documents, whatever its role."""

from __future__ import annotations

import re
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
            found |= {
                (path, m.upper()) for m in item if m in ("get", "post", "put", "patch", "delete")
            }
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


PUBLIC = {"/api/uploads", "/api/downloads", "/api/openapi.json", "/docs"}


def test_every_interpreter_operation_that_needs_a_key_declares_the_bearer_scheme() -> None:
    """Generated clients send the key only where the document says an operation needs it."""
    doc = interpreter_openapi.document()
    scheme = doc["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            security = operation.get("security", doc["security"])
            expected: list[dict[str, list[str]]] = [] if path in PUBLIC else [{"bearerAuth": []}]
            assert security == expected, (path, method)


def _resolved(doc: dict[str, Any], parameter: dict[str, Any]) -> dict[str, Any]:
    """A parameter, its `$ref` followed."""
    if "$ref" not in parameter:
        return parameter
    node: Any = doc
    for part in parameter["$ref"].removeprefix("#/").split("/"):
        node = node[part]
    return dict(node)


@pytest.mark.parametrize("which", ["exec", "interpreter"])
def test_every_path_parameter_is_declared(which: str) -> None:
    """A client generated from a document (and a fuzzer: schemathesis skips such operations
    as schema errors) needs each `{name}` of a path declared, on the path or the operation."""
    doc = (exec_openapi if which == "exec" else interpreter_openapi).document()
    undeclared = []
    for path, item in doc["paths"].items():
        wanted = set(re.findall(r"{(\w+)}", path))
        shared = {_resolved(doc, p)["name"] for p in item.get("parameters", [])}
        for method, operation in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                own = {_resolved(doc, p)["name"] for p in operation.get("parameters", [])}
                undeclared += [(method, path, n) for n in sorted(wanted - shared - own)]
    assert undeclared == []

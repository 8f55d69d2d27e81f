"""The served schema: contract v1 as published, with Sandbank's documented additions merged in."""

from __future__ import annotations

from functools import cache
from typing import Any

from ..openapi_merge import load_yaml, merge


@cache
def document() -> dict[str, Any]:
    doc = load_yaml(__package__ or "sandbank.execapi", "contract-v1.yaml")
    added: list[str] = []
    merge(doc, load_yaml(__package__ or "sandbank.execapi", "additions.yaml"), "", added)
    doc["info"]["x-sandbank-additions"] = sorted(added)
    return doc

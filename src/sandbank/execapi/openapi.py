"""The served schema: contract v1 as published, with Sandbank's documented additions merged in."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml


def _load(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(name).read_text()
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def _merge(base: dict[str, Any], extra: dict[str, Any], where: str, added: list[str]) -> None:
    for key, value in extra.items():
        here = f"{where}.{key}" if where else key
        if key in base and isinstance(base[key], dict) and isinstance(value, dict):
            _merge(base[key], value, here, added)
        else:
            base[key] = value
            added.append(here)


@cache
def document() -> dict[str, Any]:
    doc = _load("contract-v1.yaml")
    added: list[str] = []
    _merge(doc, _load("additions.yaml"), "", added)  # entries read like `paths./health`
    doc["info"]["x-sandbank-additions"] = sorted(added)
    return doc

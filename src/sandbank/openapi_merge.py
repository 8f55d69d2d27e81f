"""Served API schemas: a published seed document with Sandbank's documented additions merged in."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml


def load_yaml(package: str, name: str) -> dict[str, Any]:
    text = resources.files(package).joinpath(name).read_text()
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def merge(base: dict[str, Any], extra: dict[str, Any], where: str, added: list[str]) -> None:
    """Deep-merge `extra` into `base`; every key it adds or replaces is appended to `added`."""
    for key, value in extra.items():
        here = f"{where}.{key}" if where else key  # reads like `paths./health`
        if key in base and isinstance(base[key], dict) and isinstance(value, dict):
            merge(base[key], value, here, added)
        else:
            base[key] = value
            added.append(here)

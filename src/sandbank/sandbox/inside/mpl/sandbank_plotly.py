"""Plotly in the sandbox: `fig.show()` saves the figure as JSON in the workspace (`plotly_N.json`).

Runs inside the sandbox (standard library only until plotly itself is imported). `install()`
puts an import hook on `sys.meta_path` that, once plotly has built its renderer registry,
adds a renderer writing the figure to a fresh file and makes it the default. Code that never
imports plotly pays nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import traceback
import types
from collections.abc import Sequence
from typing import Any

WORKSPACE = os.environ.get("SANDBANK_WORKSPACE", "/workspace")
RENDERERS_MODULE = "plotly.io._renderers"  # where plotly builds `plotly.io.renderers`
RENDERER = "sandbank"


def save(fig_dict: dict[str, Any]) -> str:
    """Write a figure as Plotly JSON to the first free `plotly_N.json`; its path."""
    import plotly.io as pio

    text = pio.to_json(fig_dict, validate=False)
    n = 1
    while True:
        path = os.path.join(WORKSPACE, f"plotly_{n}.json")
        try:
            with open(path, "x", encoding="utf-8") as f:  # "x": never overwrite a file
                f.write(text)
            return path
        except FileExistsError:
            n += 1


def register(renderers_module: types.ModuleType) -> None:
    """Add the renderer to plotly's registry and make it the default of `fig.show()`."""
    from plotly.io._base_renderers import ExternalRenderer

    class WorkspaceJsonRenderer(ExternalRenderer):  # type: ignore[misc]
        def render(self, fig_dict: dict[str, Any]) -> None:
            save(fig_dict)

    renderers_module.renderers[RENDERER] = WorkspaceJsonRenderer()
    renderers_module.renderers.default = RENDERER


class _Loader(importlib.abc.Loader):
    """The real loader of plotly's renderer module, then `register` on the fresh module."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        try:
            register(module)
        except Exception:
            traceback.print_exc()  # plotly still works, `fig.show()` just saves nothing

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # get_source (tracebacks), resource readers, ...


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != RENDERERS_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Hook plotly's renderer registry (once); the worker calls this at start."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())

"""Matplotlib backend for the sandbox: Agg rendering; `show()` saves figures as PNG files."""

from __future__ import annotations

import os
import sys
from typing import Any

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase

WORKSPACE = os.environ.get("SANDBANK_WORKSPACE", "/workspace")
SAVED = "_sandbank_saved"  # set on a figure the code saved to a file itself
_savefig = Figure.savefig


def _noting_savefig(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> Any:
    result = _savefig(self, fname, *args, **kwargs)
    if isinstance(fname, str | os.PathLike):
        # The code chose where this chart goes: it is not saved again as figure_N.png (one
        # chart, one file in the results and the session's list).
        setattr(self, SAVED, True)
    return result


if Figure.savefig is _savefig:  # once, even if this module is loaded again
    Figure.savefig = _noting_savefig


def fresh_name(stem: str = "figure", suffix: str = ".png") -> str:
    n = 1
    while os.path.lexists(os.path.join(WORKSPACE, f"{stem}_{n}{suffix}")):
        n += 1
    return os.path.join(WORKSPACE, f"{stem}_{n}{suffix}")


def save_all() -> list[str]:
    """Save every open figure under a fresh name in the workspace (but those the code saved to a
    file itself), then close them (in a notebook call, display them instead: see
    sandbank_inside.contexts)."""
    import matplotlib.pyplot as plt

    contexts = sys.modules.get("sandbank_inside.contexts")
    show_figure = getattr(contexts, "show_figure", None)
    if show_figure is not None:
        for num in plt.get_fignums():
            show_figure(plt.figure(num))
        plt.close("all")
        return []
    saved = []
    for num in plt.get_fignums():
        if getattr(plt.figure(num), SAVED, False):
            continue
        path = fresh_name()
        plt.figure(num).savefig(path)
        saved.append(path)
    plt.close("all")
    return saved


def show(*args: Any, **kwargs: Any) -> None:
    save_all()

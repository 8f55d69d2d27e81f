"""Display outputs, as notebooks have them: an object's representations by media type.

`display(obj)` (a builtin of the session, as in IPython) and a cell's echoed last expression
give a bundle: `text/plain` always, and whatever the object's `_repr_*_` methods give
(`text/html` for a DataFrame, `image/png` for a matplotlib figure...). A method that raises
is skipped. Bundles are capped: a representation over the cap is left out, and said so.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Any

MAX_BUNDLE_CHARS = 1 << 20  # all representations of one object together
MAX_BUNDLES = 50  # per call

# _repr_ method → media type; binary ones are sent base64-encoded.
REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)
BINARY = {"image/png", "image/jpeg"}


def _figure_png(obj: Any) -> bytes | None:
    """A matplotlib figure's PNG, without importing matplotlib for objects that are not one."""
    cls = type(obj)
    if cls.__name__ != "Figure" or not cls.__module__.startswith("matplotlib"):
        return None
    buf = io.BytesIO()
    obj.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def bundle(obj: Any) -> dict[str, Any]:
    """{"data": {media type: text}, "cut": [media types left out for their size]}."""
    data: dict[str, str] = {}
    cut: list[str] = []
    try:
        data["text/plain"] = repr(obj)
    except Exception as e:
        data["text/plain"] = f"<{type(obj).__name__} object; repr failed: {e!r}>"
    used = len(data["text/plain"])
    rich: list[tuple[str, Callable[[], Any]]] = []
    for method, media in REPR_METHODS:
        fn = getattr(obj, method, None)
        if callable(fn) and not isinstance(obj, type):
            rich.append((media, fn))
    rich.append(("image/png", lambda: _figure_png(obj)))
    for media, fn in rich:
        if media in data:
            continue
        try:
            value = fn()
        except Exception:  # noqa: S112 - a broken _repr_*_ only loses that form
            continue
        if isinstance(value, tuple):  # (data, metadata), as IPython allows
            value = value[0]
        if value is None:
            continue
        text = _as_text(media, value)
        if text is None:
            continue
        if used + len(text) > MAX_BUNDLE_CHARS:
            cut.append(media)
            continue
        data[media] = text
        used += len(text)
    if len(data["text/plain"]) > MAX_BUNDLE_CHARS:
        data["text/plain"] = data["text/plain"][:MAX_BUNDLE_CHARS] + "..."
        cut.append("text/plain (shortened)")
    out: dict[str, Any] = {"data": data}
    if cut:
        out["cut"] = cut
    return out


def _as_text(media: str, value: Any) -> str | None:
    if media in BINARY:
        if isinstance(value, bytes | bytearray):
            return base64.b64encode(value).decode("ascii")
        return str(value) if isinstance(value, str) else None  # already base64
    if media == "application/json":
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return None
    return value if isinstance(value, str) else None

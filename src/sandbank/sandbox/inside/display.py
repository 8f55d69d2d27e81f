"""Display outputs, as notebooks have them: an object's representations by media type.

IPython's formatters make them (`display(obj)`, an echoed value, `IPython.display.HTML`...):
`text/plain` always, and whatever the object's `_repr_*_` methods give (`text/html` for a
DataFrame...); a matplotlib figure gets `image/png`. Here a formatted object becomes a bundle:
binary forms base64-encoded, JSON forms serialized, and the whole capped: a representation over
the cap is left out, and said so.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

MAX_BUNDLE_CHARS = 1 << 20  # all representations of one object together
MAX_BUNDLES = 50  # per call
BINARY = {"image/png", "image/jpeg", "application/pdf"}


def figure_png(fig: Any) -> bytes:
    """A matplotlib figure's PNG (IPython's formatter for `matplotlib.figure.Figure`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def bundle_of(data: dict[str, Any]) -> dict[str, Any]:
    """{"data": {media type: text}, "cut": [media types left out for their size]}."""
    shown: dict[str, str] = {}
    cut: list[str] = []
    plain = data.get("text/plain")
    shown["text/plain"] = plain if isinstance(plain, str) else ""
    used = len(shown["text/plain"])
    for media, value in data.items():
        if media == "text/plain":
            continue
        text = _as_text(media, value)
        if text is None:
            continue
        if used + len(text) > MAX_BUNDLE_CHARS:
            cut.append(media)
            continue
        shown[media] = text
        used += len(text)
    if len(shown["text/plain"]) > MAX_BUNDLE_CHARS:
        shown["text/plain"] = shown["text/plain"][:MAX_BUNDLE_CHARS] + "..."
        cut.append("text/plain (shortened)")
    out: dict[str, Any] = {"data": shown}
    if cut:
        out["cut"] = cut
    return out


def _as_text(media: str, value: Any) -> str | None:
    if media in BINARY:
        if isinstance(value, bytes | bytearray):
            return base64.b64encode(value).decode("ascii")
        return value if isinstance(value, str) else None  # already base64
    if media == "application/json" or not isinstance(value, str):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return None
    return value

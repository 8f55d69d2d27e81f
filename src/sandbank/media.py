"""Media types of files by name (what file listings report and downloads are served as)."""

from __future__ import annotations

import mimetypes


def media_type(name: str) -> str:
    return mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"

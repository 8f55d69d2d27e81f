"""Byte streams: a body, a form field, a file read whole, never past its cap."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable


async def gather(chunks: AsyncIterator[bytes], cap: int, refuse: Callable[[], Exception]) -> bytes:
    """All of `chunks`; `refuse()` is raised as soon as they pass `cap` bytes."""
    data = bytearray()
    async for chunk in chunks:
        data += chunk
        if len(data) > cap:
            raise refuse()
    return bytes(data)

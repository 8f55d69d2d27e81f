"""A sparse file (a session's disk image) as its data extents alone, to move it whole and small.

A 1 GiB workspace image holding a few MiB of files travels as those MiB: `pack` writes the
image's size and each data extent (offset, length, bytes) found with SEEK_DATA/SEEK_HOLE;
`unpack` writes them back into a file of that size, leaving the holes unallocated.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

MAGIC = b"sandbank-sparse-v1\n"
_EXTENT = struct.Struct(">QQ")
_CHUNK = 1 << 20


class Malformed(ValueError):
    """Not a packed image, or one whose extents leave the image."""


def pack(image: Path, packed: Path) -> None:
    with open(image, "rb") as src, open(packed, "wb") as out:
        size = os.fstat(src.fileno()).st_size
        out.write(MAGIC + struct.pack(">Q", size))
        pos = 0
        while pos < size:
            try:
                start = os.lseek(src.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past pos
                break
            end = os.lseek(src.fileno(), start, os.SEEK_HOLE)
            out.write(_EXTENT.pack(start, end - start))
            src.seek(start)
            left = end - start
            while left:
                chunk = src.read(min(_CHUNK, left))
                if not chunk:
                    raise OSError(f"{image} shrank while it was packed")
                out.write(chunk)
                left -= len(chunk)
            pos = end


def unpack(packed: Path, image: Path) -> None:
    with open(packed, "rb") as src, open(image, "wb") as out:
        head = src.read(len(MAGIC) + 8)
        if len(head) != len(MAGIC) + 8 or not head.startswith(MAGIC):
            raise Malformed("not a packed disk image")
        (size,) = struct.unpack(">Q", head[len(MAGIC) :])
        out.truncate(size)
        while record := src.read(_EXTENT.size):
            if len(record) != _EXTENT.size:
                raise Malformed("a packed disk image ends inside an extent")
            start, length = _EXTENT.unpack(record)
            if start + length > size:
                raise Malformed("a packed disk image's extent lies past its end")
            out.seek(start)
            while length:
                chunk = src.read(min(_CHUNK, length))
                if not chunk:
                    raise Malformed("a packed disk image ends inside an extent")
                out.write(chunk)
                length -= len(chunk)

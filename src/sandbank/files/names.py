"""Which names a user's file may have: `validate_filename`, `validate_stored_name`."""

from __future__ import annotations

import unicodedata

from sandbank.errors import BadRequest

MAX_FILENAME_BYTES = 255  # the usual filesystem limit on one path component
_PUNCTUATION = frozenset(" ._-()+,=@")


def validate_filename(name: str) -> str:
    """The name in NFC form if it is a safe plain file name; `BadRequest` otherwise.

    Conservative on purpose: names travel into shells, URLs, headers and S3 keys.
    """
    name = unicodedata.normalize("NFC", name)
    if not name:
        raise BadRequest("filename is empty")
    if len(name.encode()) > MAX_FILENAME_BYTES:
        raise BadRequest(f"filename is longer than {MAX_FILENAME_BYTES} bytes")
    if name[0] in ".-":
        raise BadRequest("filename may not start with a dot or a dash")
    if ".." in name:
        raise BadRequest("filename may not contain '..'")
    if name != name.strip():
        raise BadRequest("filename may not start or end with whitespace")
    for ch in name:
        if not (ch.isalnum() or ch in _PUNCTUATION):
            raise BadRequest(f"filename may not contain {ch!r}")
    return name


def validate_stored_name(name: str) -> str:
    """A file of a session: an upload's name or a produced file's workspace-relative path."""
    return "/".join(validate_filename(part) for part in name.split("/"))

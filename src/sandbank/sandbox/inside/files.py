"""Produced files: what a call created or changed in the workspace, by a scan before and after."""

from __future__ import annotations

import os
import stat

from .protocol import display_name

SCAN_LIMIT = 20000  # entries looked at per scan: a huge tree costs a bounded time
SITE_DIR_NAME = ".site"  # the session's pip packages (egress): not files the code produced

Signature = tuple[int, int, int]  # mtime_ns, size, inode


def scan(root: str) -> dict[str, Signature]:
    seen: dict[str, Signature] = {}
    stack = [""]
    while stack and len(seen) < SCAN_LIMIT:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel) if rel else root))
        except OSError:
            continue
        for e in entries:
            path = f"{rel}/{e.name}" if rel else e.name
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if path != SITE_DIR_NAME:
                    stack.append(path)
            elif stat.S_ISREG(st.st_mode):
                seen[path] = (st.st_mtime_ns, st.st_size, st.st_ino)
    return seen


def produced(root: str, before: dict[str, Signature]) -> list[str]:
    """Workspace-relative paths (shown safely) of files new or changed since `before`."""
    after = scan(root)
    return sorted(display_name(p) for p, sig in after.items() if before.get(p) != sig)

"""The `sandbank` command: `serve`, and the few admin commands."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("sandbank: not built yet", file=sys.stderr)
    return 2

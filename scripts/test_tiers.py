"""Prints how the suite splits into tiers: test functions and collected tests per tier.

A function is in the fast tier when none of its collected tests needs a slow tier (root,
postgres, s3, chromium: tests/tiers.py). Run as `make tiers`.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

SLOW = "root or postgres or s3 or chromium"


def collected(marker: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", marker],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line for line in done.stdout.splitlines() if "::" in line]


def function(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def main() -> int:
    slow, fast = collected(SLOW), collected(f"not ({SLOW})")
    tiers: dict[str, set[str]] = defaultdict(set)
    for nodeid in slow:
        tiers[function(nodeid)].add("slow")
    for nodeid in fast:
        tiers[function(nodeid)].add("fast")
    functions = len(tiers)
    fast_functions = sum(1 for t in tiers.values() if t == {"fast"})
    print(f"tests:     {len(fast)} fast, {len(slow)} slow, {len(fast) + len(slow)} in all")
    print(
        f"functions: {fast_functions} fast of {functions} "
        f"({100 * fast_functions / functions:.0f}%); a function with any slow test is slow"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

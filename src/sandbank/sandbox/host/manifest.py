"""The runtime image's own list of its packages, as `scripts/seal-runtime` wrote it at install.

`RUNTIME_DIR/sandbank-packages.json` names every distribution of the image (name, version, the
modules it provides, whether it was asked for or came as a dependency). The agent's prompt and
`sandbank doctor` read it here: what they say is installed is what the image holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "sandbank-packages.json"
IMPORTS_PER_PROCESS = 25  # each group in a fresh interpreter: memory stays that of a group


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    modules: tuple[str, ...]
    requested: bool  # asked for (runtime/requirements.in, SANDBANK_EXTRA_PACKAGES)


def load(runtime_dir: Path) -> list[Package]:
    """The image's packages; empty when the runtime has no list (built before there was one)."""
    try:
        doc = json.loads((runtime_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return []
    return [
        Package(str(p["name"]), str(p["version"]), tuple(p["modules"]), bool(p["requested"]))
        for p in doc.get("packages", [])
    ]


def describe(packages: list[Package]) -> str:
    """The packages asked for, with their versions: `numpy 2.4.6, pandas 3.1.1, ...`."""
    chosen = sorted((p for p in packages if p.requested), key=lambda p: p.name.lower())
    return ", ".join(f"{p.name} {p.version}" for p in chosen)


def modules(packages: list[Package]) -> list[str]:
    """Every top-level module the image's packages provide, sorted."""
    return sorted({m for p in packages for m in p.modules})


def import_check_code(names: list[str]) -> str:
    """Python that imports each module in fresh interpreters, in groups, and reports.

    Prints `imported N of M`, then `FAILED module: error` for each that did not import.
    """
    return f"""\
import json, subprocess, sys
names = {names!r}
group = {IMPORTS_PER_PROCESS}
probe = '''
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
bad = {{}}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as e:
        bad[name] = f"{{type(e).__name__}}: {{e}}"[:300]
print("\\\\n" + json.dumps(bad))
'''
failed = {{}}
for i in range(0, len(names), group):
    chunk = names[i:i + group]
    done = subprocess.run([sys.executable, "-c", probe, *chunk], capture_output=True, text=True)
    try:
        failed.update(json.loads(done.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        failed.update({{n: f"the importing process ended ({{done.returncode}}): {{tail}}"
                       for n in chunk}})
print(f"imported {{len(names) - len(failed)}} of {{len(names)}}")
for name, error in sorted(failed.items()):
    print(f"FAILED {{name}}: {{error}}")
"""

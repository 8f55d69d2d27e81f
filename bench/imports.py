"""The first import of each heavy package in a fresh sandbox, per backend; prints medians.

    .venv/bin/python bench/imports.py [--backends fork,bwrap] [--rounds 3] [--modules a,b]

Each round of each module leases a fresh session the way a client gets one (the server's
defaults: a warm pool, pre-imported), times `import MODULE` inside it (the interpreter's own
clock, so no round trip is counted) and destroys it. What the fork template already holds
(numpy, pandas, matplotlib, IPython) imports in ~0 ms; everything else is read from the runtime
image and initialised in the session. Run as root.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
from pathlib import Path

from sandbank.config import Settings
from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.local import LocalSandboxes

TENANT = "bench"
# Heavy or commonly first-imported modules of the runtime image.
MODULES = (
    "IPython", "pandas", "scipy.stats", "sklearn.ensemble", "statsmodels.api", "seaborn",
    "plotly.express", "pyarrow.parquet", "polars", "duckdb", "xgboost", "lightgbm", "cv2",
    "skimage", "spacy", "gensim", "nltk", "textblob", "librosa", "bokeh.plotting", "altair",
    "sympy", "networkx", "tables", "xarray", "numba", "requests", "httpx", "aiohttp", "bs4",
    "lxml.html", "openpyxl", "docx", "reportlab.pdfgen.canvas", "pypdf", "yaml",
)  # fmt: skip
TIMED = (
    "import time as _t, importlib as _il\n_t0 = _t.perf_counter()\n_il.import_module({!r})\n"
    "print(round((_t.perf_counter() - _t0) * 1000, 1))"
)


async def measure(backend: str, modules: list[str], rounds: int) -> dict[str, list[float]]:
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-"))
    await asyncio.to_thread(data.chmod, 0o711)
    rt = LocalSandboxes(
        Settings(
            data_dir=data,
            isolation=backend,  # type: ignore[arg-type]
            pool_size=2,
            memory_limit_mb=2048,
            fork_template_max_forks=0,
        )
    )
    await rt.start()
    times: dict[str, list[float]] = {m: [] for m in modules}
    try:
        for _ in range(rounds):
            for module in modules:
                await rt.pool.wait_full(timeout=600)
                s = await rt.create(TENANT)
                r = await rt.execute(s.id, TENANT, PythonCall(TIMED.format(module)), 300)
                assert r.return_code == 0, (module, r.stderr)
                times[module].append(float(r.stdout.split()[-1]))
                await rt.destroy(s.id, TENANT)
    finally:
        await rt.close()
        shutil.rmtree(data, ignore_errors=True)
    return times


async def main(args: argparse.Namespace) -> None:
    modules = args.modules.split(",") if args.modules else list(MODULES)
    results = {b: await measure(b, modules, args.rounds) for b in args.backends.split(",")}
    backends = list(results)
    print(f"{'first import (median ms)':<26}" + "".join(f"{b:>10}" for b in backends))
    for module in modules:
        row = "".join(f"{statistics.median(results[b][module]):>10.1f}" for b in backends)
        print(f"{module:<26}{row}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="fork,bwrap")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modules", default="")
    asyncio.run(main(parser.parse_args()))

"""The runtime image's packages, in real sandboxes: every module imports; pandas' formats work.

The import test is generated from the image's own list (`sandbank-packages.json`, written by
scripts/seal-runtime), so a package added to runtime/requirements.in is tested without a word
here.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbank.sandbox.backends.base import INTERPRETERS
from sandbank.sandbox.host import manifest
from sandbank.sandbox.local import LocalSandboxes
from tests.sandbox.conftest import BACKENDS, Shell, isolation_of
from tests.support import RUNTIME_DIR, settings

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]

MODULES = manifest.modules(manifest.load(Path(RUNTIME_DIR)))
GROUPS = [MODULES[i : i + 30] for i in range(0, len(MODULES), 30)]


@pytest.fixture(scope="module")
async def runtime(module_data: Path, backend_name: str) -> AsyncIterator[LocalSandboxes]:
    # Importing the heavier packages needs more than the suite's small memory limit.
    config = settings(module_data, memory_limit_mb=1024, isolation=isolation_of(backend_name))
    rt = LocalSandboxes(config, BACKENDS[backend_name](config))
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()


def test_the_image_lists_what_was_asked_for() -> None:
    assert len(MODULES) > 150, "the runtime's sandbank-packages.json is missing: `make install`"
    requested = {p.name.lower() for p in manifest.load(Path(RUNTIME_DIR)) if p.requested}
    e2b_template = {
        "aiohttp", "beautifulsoup4", "bokeh", "gensim", "imageio", "joblib", "librosa", "nltk",
        "numpy", "opencv-python-headless", "openpyxl", "plotly", "pytest", "python-docx",
        "pytz", "requests", "scikit-image", "scikit-learn", "scipy", "seaborn", "soundfile",
        "spacy", "textblob", "tornado", "urllib3", "xarray", "xlrd", "sympy",
    }  # fmt: skip
    pandas_optional = {"tabulate", "jinja2", "lxml", "html5lib", "xlsxwriter", "tables"}
    reached_for = {"httpx", "pyyaml", "networkx", "tqdm", "reportlab", "pypdf", "duckdb"}
    reached_for |= {"polars", "xgboost-cpu", "lightgbm", "ipython"}
    assert e2b_template | pandas_optional | reached_for <= requested


def test_the_image_is_built_from_the_lock() -> None:
    """Every pin of runtime/requirements.txt is in the image, at that version (else: rebuild)."""
    lock = Path(__file__).resolve().parents[2] / "runtime" / "requirements.txt"
    pins = dict(line.split("==") for line in lock.read_text().splitlines() if "==" in line)
    installed = {normalize(p.name): p.version for p in manifest.load(Path(RUNTIME_DIR))}
    stale = {n: v for n, v in pins.items() if installed.get(normalize(n)) != v}
    assert stale == {}, "the runtime image is not the lock's: `make install`"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# In the isolated backends' sandboxes (what an import can meet there: seccomp, no network, a
# read-only image); the unisolated reference adds nothing to that (~17 s of the suite).
@pytest.mark.only_backends("fork", "bwrap", "gvisor")
@pytest.mark.parametrize("group", GROUPS, ids=[f"{g[0]}..{g[-1]}" for g in GROUPS])
async def test_every_module_of_the_image_imports(sb: Shell, group: list[str]) -> None:
    r = await sb.py(manifest.import_check_code(group), timeout=240)
    assert r.return_code == 0, r
    assert f"imported {len(group)} of {len(group)}" in r.stdout, r.stdout


async def test_pandas_writes_and_reads_the_formats_it_documents(sb: Shell) -> None:
    r = await sb.py(
        "import io, pandas as pd\n"
        "df = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3.5, 19.0]})\n"
        "print(df.to_markdown(index=False))\n"
        "html = df.style.highlight_max(subset=['temp']).to_html()\n"
        "print('style', '<table' in html and 'Lima' in html)\n"
        "print('read_html', pd.read_html(io.StringIO(df.to_html()))[0]['city'].tolist())\n"
        "print('xml', pd.read_xml(io.StringIO(df.to_xml()))['city'].tolist())\n"
        "df.to_hdf('t.h5', key='t')\n"
        "print('hdf', pd.read_hdf('t.h5', 't').equals(df))\n"
        "df.to_excel('t.xlsx', engine='xlsxwriter', index=False)\n"
        "print('xlsx', pd.read_excel('t.xlsx').equals(df))\n"
        "print('calamine', pd.read_excel('t.xlsx', engine='calamine').equals(df))\n"
        "df.to_excel('t.ods', index=False)\n"
        "print('ods', pd.read_excel('t.ods').equals(df))\n"
        "df.to_parquet('t.parquet')\n"
        "print('parquet', pd.read_parquet('t.parquet').equals(df))\n"
        "print('eval', df.eval('temp * 2').tolist())",
        timeout=120,
    )
    assert r.return_code == 0, r
    lines = r.stdout.splitlines()
    assert lines[:4] == [
        "| city   |   temp |",
        "|:-------|-------:|",
        "| Oslo   |    3.5 |",
        "| Lima   |   19   |",
    ], r.stdout
    for check in ("style True", "read_html ['Oslo', 'Lima']", "xml ['Oslo', 'Lima']", "hdf True"):
        assert check in lines, r.stdout
    for check in ("xlsx True", "calamine True", "ods True", "parquet True", "eval [7.0, 38.0]"):
        assert check in lines, r.stdout


async def test_what_models_reach_for_works_offline(sb: Shell) -> None:
    r = await sb.py(
        "import yaml, networkx as nx, duckdb, polars as pl, bs4, docx, cv2, numpy as np\n"
        "from reportlab.pdfgen import canvas\nfrom pypdf import PdfReader\n"
        "print(yaml.safe_load('a: [1, 2]'))\n"
        "print(nx.shortest_path(nx.path_graph(4), 0, 3))\n"
        "print(duckdb.sql('select 40 + 2 as x').fetchall())\n"
        "print(pl.DataFrame({'a': [1, 2]}).select(pl.col('a').sum()).item())\n"
        "print(bs4.BeautifulSoup('<p>hi</p>', 'lxml').p.text)\n"
        "d = docx.Document(); d.add_paragraph('memo'); d.save('m.docx')\n"
        "c = canvas.Canvas('r.pdf'); c.drawString(72, 720, 'report'); c.save()\n"
        "print(len(PdfReader('r.pdf').pages))\n"
        "print(cv2.cvtColor(np.zeros((2, 2, 3), np.uint8), cv2.COLOR_BGR2GRAY).shape)",
        timeout=120,
    )
    assert r.return_code == 0, r
    assert r.stdout.splitlines() == [
        "{'a': [1, 2]}", "[0, 1, 2, 3]", "[(42,)]", "3", "hi", "1", "(2, 2)",
    ], r.stdout  # fmt: skip
    assert sorted(r.files) == ["m.docx", "r.pdf"]

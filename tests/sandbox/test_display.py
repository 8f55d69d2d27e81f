"""Display outputs and streamed calls, from a real interpreter."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from sandbank.protocol.calls import BashCall, Display, Done, Output, PythonCall
from sandbank.sandbox.backends.base import INTERPRETERS
from tests.sandbox.conftest import Shell

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]


async def test_a_dataframe_displays_as_a_table_and_print_stays_on_stdout(sb: Shell) -> None:
    r = await sb.py(
        "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndisplay(df)\nprint('printed')"
    )
    assert r.return_code == 0, r.stderr
    assert r.stdout == "printed\n"
    (shown,) = r.displays
    assert "<table" in shown["data"]["text/html"] and "a" in shown["data"]["text/plain"]
    r = await sb.py("df")  # an echoed value: text on stdout, the bundle beside it
    assert "a" in r.stdout and "<table" in r.displays[0]["data"]["text/html"]
    assert (await sb.py("print(1)")).displays == []
    assert (await sb.py("1 + 1")).displays == []  # plain values need no bundle


async def test_a_figure_displays_as_a_png(sb: Shell) -> None:
    r = await sb.py(
        "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(1, 1))\n"
        "plt.plot([0, 1])\ndisplay(fig)"
    )
    assert r.return_code == 0, r.stderr
    png = base64.b64decode(r.displays[0]["data"]["image/png"])
    assert png.startswith(b"\x89PNG")


async def test_markdown_broken_and_oversized_representations(sb: Shell) -> None:
    r = await sb.py(
        "class Md:\n    def _repr_markdown_(self): return '**bold**'\n"
        "class Broken:\n    def _repr_html_(self): raise ValueError('nope')\n"
        "class Huge:\n    def _repr_html_(self): return 'x' * 2_000_000\n"
        "display(Md(), Broken(), Huge())"
    )
    assert r.return_code == 0, r.stderr
    md, broken, huge = r.displays
    assert md["data"]["text/markdown"] == "**bold**"
    assert set(broken["data"]) == {"text/plain"}  # the broken form is left out, nothing fails
    assert "text/html" not in huge["data"] and huge["cut"] == ["text/html"]


async def test_a_streamed_call_hands_over_its_output_as_it_comes(sb: Shell) -> None:
    events: list[tuple[float, str, Any]] = []
    started = time.monotonic()
    code = (
        "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.4)\n"
        "display({'k': 1} and __import__('fractions').Fraction(1, 3))"
    )
    r = None
    async for event in sb.runtime.stream(sb.session.id, "tests", PythonCall(code), 20):
        at = time.monotonic() - started
        if isinstance(event, Output):
            events.append((at, event.stream, event.text))
        elif isinstance(event, Display):
            events.append((at, "display", event.bundle))
        elif isinstance(event, Done):
            r = event.result
    ended = time.monotonic() - started
    assert r is not None and r.stdout == "0\n1\n2\n"  # the result is whole, as for a plain call
    stdout = [e for e in events if e[1] == "stdout"]
    assert "".join(e[2] for e in stdout) == "0\n1\n2\n"
    assert stdout[0][0] < ended - 0.6  # the first line came long before the end
    assert [e[1] for e in events if e[1] == "display"] == ["display"]
    seen = [
        (e.stream, e.text)
        async for e in sb.runtime.stream(
            sb.session.id, "tests", BashCall("echo one; echo two >&2"), 10
        )
        if isinstance(e, Output)
    ]
    assert ("stdout", "one\n") in seen and ("stderr", "two\n") in seen


async def test_bang_lines_run_in_bash_and_valid_python_is_never_rewritten(sb: Shell) -> None:
    r = await sb.py("x = 2\n!echo from-bash $((1+1))\nprint(x)")
    assert (r.stdout, r.return_code) == ("from-bash 2\n2\n", 0), r.stderr
    r = await sb.py("y = 3 %2\nprint(y)")  # valid Python is never rewritten
    assert r.stdout == "1\n"

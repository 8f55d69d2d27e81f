"""Code runs as in a Jupyter kernel (IPython's InteractiveShell): magics, await, IPython.display."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from sandbank.protocol.calls import Display, Done, Output, PythonCall
from sandbank.sandbox.backends.base import INTERPRETERS, ISOLATION
from tests.sandbox.conftest import Shell

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]


async def test_matplotlib_inline_is_accepted_and_figures_are_still_saved(sb: Shell) -> None:
    r = await sb.py(
        "%matplotlib inline\n%config InlineBackend.figure_format = 'retina'\n"
        "import matplotlib.pyplot as plt\nplt.plot([1, 2]);"
    )
    assert (r.stdout, r.stderr, r.return_code) == ("", "", 0), r
    assert r.files == ["figure_1.png"]
    r = await sb.py("%matplotlib widget")
    assert r.return_code == 0 and "saved as PNG files" in r.stderr, r


async def test_timeit_and_time_report_timings(sb: Shell) -> None:
    r = await sb.py("%timeit -n 10 -r 2 sum(range(100))")
    assert (
        r.return_code == 0 and " per loop (mean ± std. dev. of 2 runs, 10 loops each)" in r.stdout
    )
    r = await sb.py("%%time\ntotal = sum(range(1000))\nprint(total)")
    assert r.return_code == 0 and r.stdout.startswith("499500\nCPU times: "), r
    assert "Wall time: " in r.stdout
    assert (await sb.py("total")).stdout == "499500\n"  # %%time's cell runs in the namespace


async def test_cd_env_and_shell_lines(sb: Shell) -> None:
    r = await sb.py("%mkdir -p sub\n%cd sub")
    assert r.return_code == 0 and r.stdout.rstrip().endswith("/sub"), r
    assert (await sb.py("import os; print(os.path.basename(os.getcwd()))")).stdout == "sub\n"
    await sb.py("%cd ..")
    r = await sb.py(
        "%env GREETING=hello\n!echo $GREETING from bash\nimport os\nos.environ['GREETING']"
    )
    assert r.stdout == "env: GREETING=hello\nhello from bash\n'hello'\n", r
    r = await sb.py("files = !printf 'a\\nb\\n'; echo oops >&2\nprint(files, len(files))")
    assert r.stdout == "['a', 'b', 'oops'] 3\n", r  # stderr with the lines, as IPython gives
    r = await sb.py("name = 'world'\n!echo hello {name} $name\n_exit_code")
    assert r.stdout == "hello world world\n0\n", r
    r = await sb.py("!exit 3\n_exit_code")
    assert r.stdout == "3\n", r


@pytest.mark.claims(ISOLATION)  # the sandbox's pip (unisolated, the host's runtime directory)
async def test_pip_runs_the_sandboxs_pip_which_says_who_installs_packages(sb: Shell) -> None:
    r = await sb.py("%pip list")
    assert r.return_code == 0 and "pandas" in r.stdout and "ipython" in r.stdout, r
    r = await sb.py("%pip install requests")  # the image has it: pip says so
    assert "Requirement already satisfied: requests" in r.stdout, r
    r = await sb.py("%pip install sb-no-such-package")  # no network: who installs packages
    assert "installed by the server's operator" in r.stderr, r
    r = await sb.py("%conda install numpy")
    assert "no conda" in r.stderr, r


async def test_top_level_await_keeps_its_results(sb: Shell) -> None:
    r = await sb.py(
        "import asyncio\n"
        "async def double(x):\n    await asyncio.sleep(0.01)\n    return 2 * x\n"
        "values = await asyncio.gather(double(1), double(2))\nvalues"
    )
    assert (r.stdout, r.return_code) == ("[2, 4]\n", 0), r
    r = await sb.py("async with asyncio.timeout(5):\n    later = await double(values[-1])\nlater")
    assert r.stdout == "8\n", r
    assert (await sb.py("asyncio.run(double(5))")).stdout == "10\n"  # no loop runs between calls


async def test_ipython_display_objects_arrive_as_display_bundles(sb: Shell) -> None:
    r = await sb.py(
        "from IPython.display import display, HTML, Markdown, SVG, JSON, Image, Latex\n"
        "import io\nfrom PIL import Image as PILImage\n"
        "buf = io.BytesIO(); PILImage.new('RGB', (2, 2), 'red').save(buf, 'PNG')\n"
        "display(HTML('<b>bold</b>'), Markdown('# Title'))\n"
        'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>\'))\n'
        "display(JSON({'k': [1, 2]}))\n"
        "display(Image(data=buf.getvalue()))\n"
        "display(Latex(r'$x^2$'))\n"
        "print('text stays on stdout')"
    )
    assert (r.stdout, r.return_code) == ("text stays on stdout\n", 0), r
    html, md, svg, js, png, latex = (d["data"] for d in r.displays)
    assert html["text/html"] == "<b>bold</b>" and md["text/markdown"] == "# Title"
    assert svg["image/svg+xml"].startswith("<svg")
    assert js["application/json"] == '{"k": [1, 2]}'
    assert base64.b64decode(png["image/png"]).startswith(b"\x89PNG")
    assert latex["text/latex"] == "$x^2$"
    assert all("text/plain" in d for d in (html, md, svg, js, png, latex))


async def test_clear_output_and_update_display(sb: Shell) -> None:
    r = await sb.py(
        "from IPython.display import display, clear_output, update_display\n"
        "display('first')\nclear_output()\ndisplay('second')\n"
        "h = display('v1', display_id=True)\nh.update('v2')\n"
        "display('before wait')\nclear_output(wait=True)\ndisplay('after wait')"
    )
    assert r.return_code == 0, r
    assert [d["data"]["text/plain"] for d in r.displays] == ["'after wait'"]
    r = await sb.py("h = display('v1', display_id=True)\nh.update('v2')")
    assert [d["data"]["text/plain"] for d in r.displays] == ["'v2'"]


async def test_the_repr_protocol_feeds_bundles_and_an_echoed_value(sb: Shell) -> None:
    r = await sb.py(
        "class Card:\n"
        "    def __repr__(self): return 'Card()'\n"
        "    def _repr_html_(self): return '<div>card</div>'\n"
        "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
        "        return {'application/vnd.card+json': {'suit': 'hearts'}}\n"
        "Card()"
    )
    assert r.stdout == "Card()\n", r  # the text of an echoed value stays on stdout
    (bundle,) = r.displays
    assert bundle["data"]["application/vnd.card+json"] == '{"suit": "hearts"}'
    assert bundle["data"]["text/plain"] == "Card()"
    assert (await sb.py("Card();")).displays == []  # a trailing semicolon silences it all


async def test_previous_results_and_inputs_as_in_ipython(sb: Shell) -> None:
    await sb.py("40 + 2")
    r = await sb.py("_ + 1")
    assert r.stdout == "43\n", r
    r = await sb.py("In[-1]")
    assert r.stdout == "'In[-1]'\n", r
    r = await sb.py("'Out' in dir() and len(Out)")
    assert r.stdout == "0\n", r  # echoed values are not kept for the session's life


async def test_a_cell_of_plain_python_is_parsed_once(sb: Shell) -> None:
    # Every parse of source text to a tree goes through the builtin compile with ONLY_AST: the
    # shell's check of the cell, then (before) IPython's own parse of the same text.
    await sb.py(
        "import ast, builtins\n_compile, parses = builtins.compile, []\n"
        "def counting(source, *args, **kwargs):\n"
        "    flags = args[2] if len(args) > 2 else kwargs.get('flags', 0)\n"
        "    if isinstance(source, str) and flags & ast.PyCF_ONLY_AST:\n"
        "        parses.append(source)\n"
        "    return _compile(source, *args, **kwargs)\n"
        "builtins.compile = counting"
    )
    r = await sb.py("from __future__ import annotations\nmarked = 41 + 1\nmarked")
    assert r.stdout == "42\n", r  # the last expression echoed, from the tree handed over
    r = await sb.py("def f(x: Undefined) -> int: return 1\nmarked = f(0)\nf.__annotations__")
    assert r.stdout == "{'x': 'Undefined', 'return': 'int'}\n", r  # the earlier cell's future
    r = await sb.py("builtins.compile = _compile\nprint([s.count('marked') for s in parses])")
    # Each cell once, this one too (parsed before it ran): before, [2, 2, 1, 1, 1, 1].
    assert r.stdout == "[2, 1, 1]\n", r


async def test_a_new_session_shows_nothing_of_its_warm_up(sb: Shell) -> None:
    # The worker runs a value and an error before any lease (their first use is slow under
    # gVisor): none of it is the user's history.
    r = await sb.py(
        "import sys\nprint(len(In), repr(_), [n for n in ('last_value', 'last_traceback') "
        "if hasattr(sys, n)])"
    )
    assert r.stdout == "2 '' []\n", r
    r = await sb.py("%tb")
    assert "ZeroDivisionError" not in r.stdout + r.stderr, r


async def test_tracebacks_are_ipythons_without_colour_or_the_workers_frames(sb: Shell) -> None:
    r = await sb.py("def inner():\n    raise ValueError('bad value')\n\ninner()")
    assert r.return_code == 1
    err = r.stderr
    assert "\x1b[" not in err, err
    assert "ValueError                                Traceback (most recent call last)" in err
    assert "----> 4 inner()" in err and "----> 2     raise ValueError('bad value')" in err
    assert err.rstrip().endswith("ValueError: bad value")
    for ours in ("pyexec", "worker.py", "sandbank", "interactiveshell", "skipping hidden"):
        assert ours not in err, err
    r = await sb.py("print('ok'")
    assert r.return_code == 1 and "SyntaxError" in r.stderr and "\x1b[" not in r.stderr, r


async def test_magics_and_displays_stream_as_they_come(sb: Shell) -> None:
    events: list[tuple[str, Any]] = []
    code = "from IPython.display import display, HTML\n!echo from-bash\ndisplay(HTML('<i>x</i>'))"
    r = None
    async for event in sb.runtime.stream(sb.session.id, "tests", PythonCall(code), 20):
        if isinstance(event, Output):
            events.append((event.stream, event.text))
        elif isinstance(event, Display):
            events.append(("display", event.bundle))
        elif isinstance(event, Done):
            r = event.result
    assert r is not None
    assert r.return_code == 0, r
    assert ("stdout", "from-bash\n") in events
    shown = [data for kind, data in events if kind == "display"]
    assert shown and shown[0]["data"]["text/html"] == "<i>x</i>"

"""Plotly in the sandbox: `fig.show()` saves the figure as JSON under a fresh name, reported."""

from __future__ import annotations

import json

import pytest

from tests.sandbox.conftest import Shell

pytestmark = pytest.mark.anyio


async def test_a_shown_plotly_figure_is_saved_as_json_and_reported(sb: Shell) -> None:
    # A file of that name already there is never overwritten: the next free name is taken.
    assert (await sb.py("open('plotly_1.json', 'w').write('mine')")).return_code == 0
    r = await sb.py(
        "import plotly.graph_objects as go\n"
        "fig = go.Figure(go.Bar(x=['a', 'b'], y=[1, 41]), layout={'title': {'text': 'T'}})\n"
        "fig.show()\n"
        "fig.show()",
        timeout=60,
    )
    assert (r.return_code, r.stderr) == (0, "")
    assert sorted(r.files) == ["plotly_2.json", "plotly_3.json"]
    saved = json.loads((await sb.py("print(open('plotly_2.json').read())")).stdout)
    assert saved["data"][0]["type"] == "bar" and saved["data"][0]["x"] == ["a", "b"]
    assert saved["layout"]["title"]["text"] == "T"
    assert (await sb.py("print(open('plotly_1.json').read())")).stdout == "mine\n"
    # Writing the JSON by hand works as everywhere; it is reported like any produced file.
    r = await sb.py(
        "fig.write_json('by_hand.json')\nimport plotly.io as pio\nprint(pio.renderers.default)"
    )
    assert (r.stdout, r.files) == ("sandbank\n", ["by_hand.json"])

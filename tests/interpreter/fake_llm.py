"""A fake LLM on loopback answering by the question: OpenAI chat completions or Anthropic messages.

The question picks the code the "model" runs (see `CODE`); once a tool result comes back, it
answers with that result quoted, so tests see the real output travel through the whole stack.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.agent.fake_llm_servers import (
    CHUNK_DELAY,
    FakeLLMServer,
    anthropic_answer,
    anthropic_tool_use,
    openai_answer,
    openai_tool_call,
    serve_replies,
)

CHART_CODE = """\
import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv("data.csv")
print("TOTAL", df["value"].sum())
fig = plt.figure()
plt.bar(df["name"], df["value"])
fig.savefig("chart.png")
plt.close("all")
"""
OVERWRITE_CODE = """\
import os
for attempt in (lambda: open("data.csv", "w"), lambda: os.remove("data.csv"),
                lambda: os.rename("data.csv", "moved.csv")):
    try:
        attempt()
        print("CHANGED")
    except OSError as e:
        print("REFUSED", type(e).__name__)
print(open("data.csv").read().splitlines()[0])
"""
# A pause first, so that a client polling every second sees the run PENDING.
REPORT_CODE = "import time\ntime.sleep(1.5)\n" + CHART_CODE
PAGE_CODE = """\
open("page.html", "w").write("<h1>made by the agent</h1><script>parent.__sbPwned = 'page'</script>")
print("wrote page.html")
"""
# A matplotlib chart left open (saved as figure_1.png), a Plotly figure shown (plotly_1.json) and
# a Markdown file.
PLOTLY_CODE = """\
import pandas as pd
import matplotlib.pyplot as plt
import plotly.express as px
df = pd.read_csv("data.csv")
print("TOTAL", df["value"].sum())
plt.bar(df["name"], df["value"])
fig = px.bar(df, x="name", y="value")
fig.update_layout(title="Sum 42")
fig.show()
open("summary.md", "w").write("# Summary\\n\\nThe **total** is 42.\\n")
"""
# Display bundles with hostile markup: a table that must survive sanitizing, and what must not.
DISPLAY_CODE = """\
class Table:
    def _repr_html_(self):
        return (
            '<style>body { display: none }</style>'
            '<table border="1" class="dataframe" onclick="parent.__sbPwned = 1">'
            '<thead><tr><th>name</th><th>value</th></tr></thead>'
            '<tbody><tr><td>a</td><td colspan="1">42</td></tr></tbody></table>'
            '<script>parent.__sbPwned = "script"</script>'
            '<img src="missing.png" onerror="window.__sbPwned = 1">'
            '<a href="javascript:window.__sbPwned = 1">click me</a>'
            '<iframe src="https://outside.invalid/frame"></iframe>'
            '<img src="https://outside.invalid/pixel.png">'
        )
class Dot:
    def _repr_svg_(self):
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40">'
            '<circle cx="20" cy="20" r="16" fill="teal"/>'
            '<script>parent.__sbPwned = "svg"</script></svg>'
        )
display(Table())
display(Dot())
print("shown")
"""
# A real pandas table displayed (its HTML has a <style> and style="..." attributes) and echoed.
PANDAS_CODE = """\
import pandas as pd
df = pd.DataFrame({"region": ["north", "south"], "sales": [10, 32]})
display(df)
df
"""
# A chart saved by the code and left open: it must be one file, not two.
SAVEFIG_CODE = """\
import matplotlib.pyplot as plt
plt.bar(["a", "b"], [1, 2])
plt.savefig("chart.png")
print("saved")
"""
# Keyword in the question → the code the model runs.
CODE = {
    "pandas": PANDAS_CODE,
    "savefig": SAVEFIG_CODE,
    "chart": CHART_CODE,
    "overwrite": OVERWRITE_CODE,
    "sleep": "import time\nprint('sleeping', flush=True)\ntime.sleep(300)",
    "report": REPORT_CODE,
    "page": PAGE_CODE,
    "plotly": PLOTLY_CODE,
    "nap": "import time\ntime.sleep(1.5)\nprint('rested')",
    "display": DISPLAY_CODE,
    # Reads what an earlier question's code left in the namespace (CHART_CODE's `df`).
    "recall": "print('ROWS', len(df))",
}
# Keyword in the question → the final answer (`{result}`: the tool's output as the model saw it).
ANSWERS = {
    "report": (
        "Here is data.csv, summed.\n\n| name | value |\n|---|---:|\n| a | 1 |\n| b | 2 |\n"
        "| c | 39 |\n\n![Bar chart of value by name](chart.png)\n\nResult: {result}"
    ),
    "page": "I wrote [the page](page.html).",
    # The tags the interpreter spec's own web client renders (SANDBANK_AGENT_ANSWER_FORMAT=tags).
    "plotly": (
        "The values by name:\n\n<png>figure_1.png</png>\n\nInteractive:\n\n"
        "<plotly>plotly_1.json</plotly>\n\n<md>summary.md</md>\n\n"
        "A tag in code stays text: `<png>figure_1.png</png>`\n\nResult: {result}"
    ),
}
# An answer steered by a hostile file: markup that must stay inert in a client.
HOSTILE_ANSWER = (
    "Summary <script>window.__sbPwned = 'script'</script>\n\n"
    '<img src="missing.png" onerror="window.__sbPwned = \'onerror\'">\n\n'
    "![tracker](http://outside.invalid/pixel.png)\n\n"
    '<img src="https://outside.invalid/img.png">\n\n'
    "[click me](javascript:window.__sbPwned='link') and <b onmouseover=\"window.__sbPwned='b'\">bold</b>"
)
# Streamed a word every SLOW_CHUNK_S when asked "slowly": text visibly arrives before the end.
SLOW_ANSWER = "Counting " + " ".join(f"w{i}" for i in range(1, 15)) + " done."
SLOW_CHUNK_S = 0.12
# Keyword in the question → an answer given without running code.
DIRECT = {"hostile": HOSTILE_ANSWER, "slowly": SLOW_ANSWER}
_ids = itertools.count(1)


def _code_for(question: str) -> str | None:
    return next((code for word, code in CODE.items() if word in question.lower()), None)


def _answer_for(question: str, result: str) -> str:
    template = next((a for word, a in ANSWERS.items() if word in question.lower()), None)
    return (template or "Result: {result}").replace("{result}", result)


def _direct_answer(question: str) -> str:
    found = (a for word, a in DIRECT.items() if word in question.lower())
    return next(found, "Hello from the fake model.")


def openai_reply(request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    last = request["messages"][-1]
    if last["role"] == "tool":
        question = next(m for m in reversed(request["messages"]) if m["role"] == "user")
        return openai_answer(_answer_for(str(question["content"]), str(last["content"])))
    code = _code_for(str(last["content"]))
    if code is None:
        status, body = openai_answer(_direct_answer(str(last["content"])))
        if "slowly" in str(last["content"]).lower():
            body[CHUNK_DELAY] = SLOW_CHUNK_S
        return status, body
    status, body = openai_tool_call(code)
    body["choices"][0]["message"]["tool_calls"][0]["id"] = f"call_{next(_ids)}"
    return status, body


def anthropic_reply(request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    last = request["messages"][-1]
    blocks = last["content"] if isinstance(last["content"], list) else []
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        content = results[-1]["content"]
        text = content if isinstance(content, str) else json.dumps(content)
        return anthropic_answer(f"Result: {text}")
    question = last["content"] if isinstance(last["content"], str) else json.dumps(blocks)
    code = _code_for(question)
    if code is None:
        return anthropic_answer("Hello from the fake model.")
    status, body = anthropic_tool_use(code)
    body["content"][1]["id"] = f"toolu_{next(_ids)}"
    return status, body


FakeLLM = FakeLLMServer


@contextmanager
def fake_llm() -> Iterator[FakeLLM]:
    """Serves both APIs: `/v1/messages` is Anthropic's, every other POST OpenAI's."""

    def reply(fake: FakeLLM, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return (anthropic_reply if path.endswith("/messages") else openai_reply)(body)

    with serve_replies(reply) as fake:
        yield fake

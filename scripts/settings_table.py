"""Prints (or with --write, updates in README.md) the settings, API-additions, packages tables."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from sandbank.config import Settings
from sandbank.execapi.openapi import document


def default_of(name: str) -> str:
    field = Settings.model_fields[name]
    if field.default_factory is not None:
        return "(see meaning)"
    value = field.default
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value in ("", None):
        return "(empty)"
    return f"`{value}`"


def settings_table() -> str:
    rows = ["| Setting | Variable | Default | Meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        meaning = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {name} | `SANDBANK_{name.upper()}` | {default_of(name)} | {meaning} |")
    return "\n".join(rows) + "\n"


def describe(doc: dict[str, Any], dotted: str) -> str:
    """The added node's own description (following a $ref), first sentence only."""
    node: Any = doc
    rest = dotted
    while rest:  # keys may hold dots themselves (`paths./openapi.json`): the longest that fits
        key = max((k for k in node if rest == k or rest.startswith(f"{k}.")), key=len)
        node, rest = node[key], rest[len(key) + 1 :]
    if "$ref" in node:
        ref, node = node["$ref"], doc
        for key in ref.removeprefix("#/").split("/"):
            node = node[key]
    if isinstance(node, list):  # parameters: the first one's description
        node = node[0]
    operations = [node[m] for m in ("get", "post", "delete") if m in node]
    if (
        operations and "description" not in node
    ):  # a new path: its own words, or its first operation's
        node = operations[0]
    if "schema" in node and "description" not in node:  # a new media type of a response
        node = node["schema"]
    text = str(node.get("description") or node.get("summary") or "")
    return " ".join(text.split()).split(". ")[0].rstrip(".") + "."


def additions_table() -> str:
    doc = document()
    rows = ["| Addition | What it is |", "|---|---|"]
    for item in doc["info"]["x-sandbank-additions"]:
        rows.append(f"| `{item}` | {describe(doc, item)} |")
    return "\n".join(rows) + "\n"


RUNTIME = Path(__file__).resolve().parents[1] / "runtime"


def packages_table(runtime: Path = RUNTIME) -> str:
    """The runtime's packages as runtime/requirements.in groups them, pinned by its lock."""
    pins = {}
    for line in (runtime / "requirements.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[normalize(name)] = version.strip()
    groups: list[tuple[str, list[str]]] = []
    comment: list[str] = []
    started = False
    for raw in (runtime / "requirements.in").read_text().splitlines():
        line = raw.strip()
        if line.startswith("#"):
            comment.append(line.lstrip("# "))
        elif not line:
            if comment and started:
                groups.append((" ".join(comment), []))
            started = started or bool(comment)
            comment = []
        else:
            if comment:  # a group's heading right above its first package
                groups.append((" ".join(comment), []))
                comment = []
            name = line.split("#", 1)[0].strip()
            groups[-1][1].append(f"{name} {pins[normalize(name)]}")
    rows = ["| | Packages (their dependencies besides) |", "|---|---|"]
    rows += [f"| {title} | {', '.join(names)} |" for title, names in groups if names]
    return "\n".join(rows) + "\n"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def replace_between(text: str, marker: str, body: str) -> str:
    start, end = f"<!-- {marker} -->\n", f"<!-- /{marker} -->"
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    return head + start + body + end + tail


def main() -> int:
    """`--write` updates README.md; `--check` exits 1 if it is stale; otherwise prints."""
    readme = Path(__file__).resolve().parents[1] / "README.md"
    current = readme.read_text()
    text = replace_between(current, "settings-table", settings_table())
    text = replace_between(text, "additions-table", additions_table())
    text = replace_between(text, "packages-table", packages_table())
    if "--write" in sys.argv:
        readme.write_text(text)
    elif "--check" in sys.argv:
        return 0 if text == current else 1
    else:
        print(settings_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())

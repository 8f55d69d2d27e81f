"""The served schema at /api/openapi.json: the seed spec with Sandbank's additions merged in."""

from __future__ import annotations

from functools import cache
from typing import Any

from sandbank.agent.records import ToolRecord, TraceRecord
from sandbank.errors import error_numbers
from sandbank.openapi_merge import load_yaml, merge

PACKAGE = "sandbank.interpreter"
REF_TEMPLATE = "#/components/schemas/{model}"


def _record_schemas() -> dict[str, Any]:
    """The JSON content of `tool` and `trace` messages, as OpenAPI component schemas."""
    schemas: dict[str, Any] = {}
    for model in (ToolRecord, TraceRecord):
        schema = model.model_json_schema(ref_template=REF_TEMPLATE)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


@cache
def document() -> dict[str, Any]:
    doc = load_yaml(PACKAGE, "interpreter-openapi.yaml")
    added: list[str] = []
    merge(doc, load_yaml(PACKAGE, "additions.yaml"), "", added)
    generated = {
        "components": {"schemas": _record_schemas()},
        "info": {"x-sandbank-error-codes": error_numbers()},
    }
    merge(doc, generated, "", added)
    doc["info"]["x-sandbank-additions"] = sorted(added)
    return doc

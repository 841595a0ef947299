"""A small JSON Schema checker: the keywords docs/status.md's schema uses, nothing more.

jsonschema is not in the test environment and the project adds no dependency for one test;
a schema that uses a keyword this checker does not know fails loudly instead of passing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

KNOWN = {"$schema", "title", "type", "required", "additionalProperties", "properties", "items", "enum", "minimum"}
TYPES: dict[str, Any] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
    "integer": int, "number": (int, float),
}


def schema_from_doc(path: Path, heading: str) -> dict[str, Any]:
    """The first ```json block after ``heading`` in the Markdown file ``path``."""
    text = path.read_text()
    after = text[text.index(heading):]
    block = re.search(r"```json\n(.*?)```", after, re.S)
    assert block is not None, f"no json block after {heading!r} in {path}"
    return dict(json.loads(block.group(1)))


def _is(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, TYPES[name])


def errors(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema`` (empty when it conforms)."""
    unknown = set(schema) - KNOWN
    if unknown:
        raise ValueError(f"{where}: the checker does not know {sorted(unknown)}")
    found: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, name) for name in names):
            return [f"{where}: {value!r} is not of type {types}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        found.append(f"{where}: {value!r} is below {schema['minimum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        found += [f"{where}: {key!r} is missing" for key in schema.get("required", []) if key not in value]
        if schema.get("additionalProperties") is False:
            found += [f"{where}: {key!r} is not allowed" for key in value if key not in properties]
        for key, sub in properties.items():
            if key in value:
                found += errors(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += errors(item, schema["items"], f"{where}[{index}]")
    return found

"""JSON Schemas of every on-disk format Osprey writes, and one helper to validate against them.

Each ``*.vN.json`` file here is the contract of one format; code that writes or reads that
format validates through :func:`validate` so that a shared store or checkpoint written by
another team fails loudly, naming the file and the offending field, instead of deep inside
a reader.

This package imports nothing else of Osprey: it raises its own :class:`SchemaValidationError`,
and the data package turns that into Osprey's ``SchemaError`` (``osprey_data.schema_check``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["load_schema", "validate", "SCHEMA_NAMES", "SchemaValidationError"]


class SchemaValidationError(ValueError):
    """A document does not match its schema; the message names the file, the JSON path and why."""


def _schema_files() -> dict[str, Any]:
    return {p.name: p for p in resources.files(__name__).iterdir() if p.name.endswith(".json")}


SCHEMA_NAMES: tuple[str, ...] = tuple(sorted(_schema_files()))


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict[str, Any]:
    """Return the parsed schema ``name`` (e.g. ``"store-manifest.v1.json"``)."""
    files = _schema_files()
    if name not in files:
        raise KeyError(f"no schema named {name!r}; known: {sorted(files)}")
    return json.loads(files[name].read_text(encoding="utf-8"))


def validate(document: Any, schema_name: str, *, where: str) -> None:
    """Validate ``document`` against ``schema_name``.

    Args:
        document: the parsed JSON document.
        schema_name: file name of the schema in this folder.
        where: the file or URL the document came from, quoted in the error.

    Raises:
        SchemaValidationError: naming ``where``, the JSON path and the reason.
    """
    import jsonschema  # only when validating: keeps `import osprey_schemas` cheap

    validator = jsonschema.Draft202012Validator(load_schema(schema_name))
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        path = "/".join(str(p) for p in first.absolute_path) or "<root>"
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise SchemaValidationError(
            f"{where}: does not match schema {schema_name} at '{path}': {first.message}{more}"
        )

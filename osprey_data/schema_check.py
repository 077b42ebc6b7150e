"""Checking a JSON document against its schema in ``osprey_schemas``, with Osprey's error type.

The schemas package stays free of Osprey imports (it raises a plain ``ValueError`` subclass);
this is the one place its error becomes :class:`~osprey_data.errors.SchemaError`, so that the
CLI reports it like every other Osprey error. Readers and writers of every format call
:func:`validate` from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from osprey_data.errors import InputError, SchemaError
from osprey_schemas import SchemaValidationError
from osprey_schemas import validate as _validate

__all__ = ["load_json", "validate"]


def validate(document: Any, schema_name: str, *, where: str) -> None:
    """Validate ``document`` against ``schema_name`` (a file name in ``schemas/``).

    Raises:
        SchemaError: naming ``where``, the JSON path and the reason.
    """
    try:
        _validate(document, schema_name, where=where)
    except SchemaValidationError as exc:
        raise SchemaError(str(exc)) from None


def load_json(path: str | Path, schema_name: str, *, what: str) -> Any:
    """Read the JSON file ``path`` (a ``what``, e.g. "cost model") and validate it against ``schema_name``.

    Raises:
        InputError: the file is missing or not JSON (naming it).
        SchemaError: it does not match the schema (naming it, the JSON path and the reason).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} {path}: no such file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {path}: not valid JSON ({exc})") from None
    validate(doc, schema_name, where=str(path))
    return doc

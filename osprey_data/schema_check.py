"""Checking a JSON document against its schema in ``osprey_schemas``, with Osprey's error type.

The schemas package stays free of Osprey imports (it raises a plain ``ValueError`` subclass);
this is the one place its error becomes :class:`~osprey_data.errors.SchemaError`, so that the
CLI reports it like every other Osprey error. Readers and writers of every format call
:func:`validate` from here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from osprey_data import jsonio
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
        doc = jsonio.loads(path.read_bytes())   # bounded nesting: never a RecursionError
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise InputError(f"{what} {path}: unreadable ({exc.strerror})") from None
    bad = _non_finite(doc)
    if bad is not None:   # Python reads NaN / Infinity, and a schema's minimum lets NaN through
        raise SchemaError(f"{path}: {bad[0]} is {bad[1]}, not a finite number (NaN and Infinity are not JSON)")
    validate(doc, schema_name, where=str(path))
    return doc


def _non_finite(doc: Any) -> tuple[str, float] | None:
    """(JSON path such as ``$.verify.4``, value) of the first NaN/inf number in ``doc``, or None."""
    stack: list[tuple[Any, str]] = [(doc, "$")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return where, node
        if isinstance(node, dict):
            stack.extend((v, f"{where}.{k}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node))
    return None

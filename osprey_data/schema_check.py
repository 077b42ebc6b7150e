"""Checking a JSON document against its schema in ``osprey_schemas``, with Osprey's error type.

The schemas package stays free of Osprey imports (it raises a plain ``ValueError`` subclass);
this is the one place its error becomes :class:`~osprey_data.errors.SchemaError`, so that the
CLI reports it like every other Osprey error. Readers and writers of every format call
:func:`validate` from here.
"""

from __future__ import annotations

from typing import Any

from osprey_data.errors import SchemaError
from osprey_schemas import SchemaValidationError
from osprey_schemas import validate as _validate

__all__ = ["validate"]


def validate(document: Any, schema_name: str, *, where: str) -> None:
    """Validate ``document`` against ``schema_name`` (a file name in ``schemas/``).

    Raises:
        SchemaError: naming ``where``, the JSON path and the reason.
    """
    try:
        _validate(document, schema_name, where=where)
    except SchemaValidationError as exc:
        raise SchemaError(str(exc)) from None

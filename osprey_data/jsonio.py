"""Parsing JSON from files Osprey did not necessarily write, with a nesting limit.

``json.loads`` recurses once per nesting level: a 100,000-deep ``[[[[...]]]]`` line in an input
file or a crafted ``manifest.json`` ends in ``RecursionError`` — a traceback, not an error
naming the file, and one that ``--on-error skip`` could not count. :func:`loads` turns both that
and any document nested deeper than :data:`MAX_JSON_DEPTH` into :class:`JSONTooDeepError`, a
``json.JSONDecodeError``, so every caller's existing "not valid JSON" handling reports it with
the file and line. No Osprey file nests deeper than about ten levels; conversations about as much.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "JSONTooDeepError", "loads", "depth_exceeds"]

MAX_JSON_DEPTH = 100


class JSONTooDeepError(json.JSONDecodeError):
    """A JSON document nested deeper than the limit (caught wherever invalid JSON is)."""

    def __init__(self, limit: int) -> None:
        message = f"nested deeper than {limit} levels (the limit for Osprey's JSON inputs)"
        ValueError.__init__(self, message)
        self.limit = limit
        self.msg, self.doc, self.pos, self.lineno, self.colno = message, "", 0, 1, 1

    def __reduce__(self):  # exceptions cross process boundaries by pickling their args
        return (type(self), (self.limit,))


def depth_exceeds(doc: Any, limit: int) -> bool:
    """Whether lists/objects in ``doc`` nest more than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def loads(data: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that raises :class:`JSONTooDeepError` instead of recursing without bound.

    Raises:
        json.JSONDecodeError: not JSON, or nested deeper than ``max_depth``.
        UnicodeDecodeError: ``bytes`` that are not UTF-8.
    """
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data).decode("utf-8")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise JSONTooDeepError(max_depth) from None
    if depth_exceeds(doc, max_depth):
        raise JSONTooDeepError(max_depth)
    return doc

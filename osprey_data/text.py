"""Showing untrusted strings (sample ids, domains, paths, file contents) in human-readable output.

A store or an input file is data from elsewhere: a domain holding a newline could forge a line of
a report (``problem: ...``), ANSI escape sequences could move the cursor or recolour the
terminal, and bidirectional-override characters could make text read differently from what it is.
:func:`printable` escapes every character that is not printable the way Python's ``repr`` does
(``\\n``, ``\\x1b``, ``\\u202e``); ordinary text, non-ASCII letters included, is left as it is.
Backslashes are not doubled, so a line that already holds ``repr``-quoted values can be passed
through again unchanged. JSON output needs none of this (``json.dumps`` escapes control
characters itself).
"""

from __future__ import annotations

__all__ = ["printable", "printable_text"]


def printable(value: object) -> str:
    """``str(value)`` with control and other non-printable characters escaped repr-style."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def printable_text(text: str) -> str:
    """Multi-line text (a stored sample, a generated answer) for a terminal: line breaks and tabs
    kept, every other non-printable character escaped as :func:`printable` does."""
    return "\n".join("\t".join(printable(part) for part in line.split("\t")) for line in str(text).split("\n"))

"""The sha256 of a file's content, read in blocks: one helper for checkpoints, study stages and plans."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["file_sha256"]

_BLOCK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of the file at ``path`` (read 1 MiB at a time: weights files are large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()

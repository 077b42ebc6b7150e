"""Deterministic split of the samples among independent workers, by sample id.

Every worker reads all inputs and keeps the samples whose id hashes to its index, so N jobs on
N machines (or torchrun ranks) need no coordination and together cover every sample exactly
once. sha256 (not Python's salted ``hash``) keeps the split identical across processes and
machines.
"""

from __future__ import annotations

import hashlib

__all__ = ["worker_of", "belongs_to"]


def worker_of(key: str, num_workers: int) -> int:
    """The worker in ``[0, num_workers)`` that owns ``key`` (a sample id or ``file:line``)."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if num_workers == 1:
        return 0
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % num_workers


def belongs_to(key: str, worker_index: int, num_workers: int) -> bool:
    """True when ``key`` is this worker's to process."""
    return worker_of(key, num_workers) == worker_index

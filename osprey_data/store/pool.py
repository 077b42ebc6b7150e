"""A small process-wide thread pool for decoding chunks in parallel (fork-safe).

zstd decompression, CRC32C and the numpy ufuncs that assemble hidden states all release the
GIL, so a reader can decode the chunks of one sample on several cores at once. One pool per
process is shared by every reader; it is recreated after a fork (a DataLoader worker must not
inherit a pool whose threads do not exist in the child).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["DEFAULT_DECODE_THREADS", "decode_pool"]

# Two threads: the machines this project targets give a reader process ~2 cores; with more
# DataLoader workers than cores, pass decode_threads=1.
DEFAULT_DECODE_THREADS = max(1, min(2, os.cpu_count() or 1))

_lock = threading.Lock()
_pools: dict[int, tuple[int, ThreadPoolExecutor]] = {}


def _after_fork_in_child() -> None:
    # the parent's pool threads do not exist here, and _lock may have been held at fork time
    global _lock
    _lock = threading.Lock()
    _pools.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def decode_pool(threads: int) -> ThreadPoolExecutor | None:
    """The shared pool with ``threads`` workers (None for ``threads <= 1``: decode inline)."""
    if threads <= 1:
        return None
    pid = os.getpid()
    with _lock:
        hit = _pools.get(threads)
        if hit is None or hit[0] != pid:
            _pools[threads] = hit = (pid, ThreadPoolExecutor(max_workers=threads,
                                                              thread_name_prefix="osprey-decode"))
        return hit[1]

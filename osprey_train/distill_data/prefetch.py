"""Preparing the next micro-batches on a background thread, so distillation never waits on the store.

:class:`BatchPrefetcher` wraps a *pure* ``index -> batch`` function (``StorePacker.batch``: the
batch of global micro-batch ``index`` depends only on the seed and the index). When batch ``i``
is requested it also queues ``i + stride, ..., i + depth * stride`` — the indices this rank asks
for next (``stride`` = world size) — on one worker thread. Reading, CRC checks and decompression
of the store release the GIL, so they overlap the training step. Because the function is pure,
the prefetched batches are exactly the ones a direct call would build, in the same order, and a
request for any other index (a resumed run, a skipped step) is simply built on demand: resume
stays exact.

Every call of the function runs on the one worker thread, so the store reader behind it is never
used by two threads at once. An error while building a batch is raised by :meth:`get` for that
batch, in the caller's thread, never earlier.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from osprey_data.errors import ConfigError

__all__ = ["BatchPrefetcher"]

T = TypeVar("T")


class BatchPrefetcher(Generic[T]):
    """``get(i)`` returns ``make(i)``, building the next ``depth`` batches in the background."""

    def __init__(self, make: Callable[[int], T], *, depth: int = 2, stride: int = 1,
                 stop: int | None = None) -> None:
        """``make``: pure index -> batch function; ``depth``: batches prepared ahead (memory:
        ``depth`` extra batches); ``stride``: distance between consecutive requests; ``stop``:
        no index >= stop is prepared ahead (the run's last batch)."""
        if depth < 1 or stride < 1:
            raise ConfigError(f"prefetch depth and stride must be >= 1, got {depth}, {stride}")
        self._make, self.depth, self.stride, self.stop = make, int(depth), int(stride), stop
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osprey-prefetch")
        # an abandoned prefetcher must not keep building batches nobody will ask for
        self._finalizer = weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)

    def get(self, index: int) -> T:
        with self._lock:
            future = self._pending.pop(index, None)
            ahead = {i for i in (index + k * self.stride for k in range(1, self.depth + 1))
                     if self.stop is None or i < self.stop}
            for i in [i for i in self._pending if i not in ahead]:  # off the expected path
                self._pending.pop(i).cancel()
            if future is None:
                future = self._executor.submit(self._make, index)
            for i in sorted(ahead):  # FIFO on one thread: the requested batch comes first
                if i not in self._pending:
                    self._pending[i] = self._executor.submit(self._make, i)
        return future.result()

    def close(self) -> None:
        """Drop the queued batches and stop the worker thread (the batch in flight finishes)."""
        with self._lock:
            for f in self._pending.values():
                f.cancel()
            self._pending.clear()
        self._finalizer()

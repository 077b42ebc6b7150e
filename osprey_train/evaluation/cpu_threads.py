"""How many torch CPU threads a measurement should use on a machine shared with other jobs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["busy_machine_threads", "torch_threads"]


def busy_machine_threads(note=None) -> int | None:
    """1 torch thread when other jobs already keep every core busy, else None (torch's default).

    On a loaded box several OpenMP threads spin-wait for each other; measured here at a load
    average of 5-8 on 2 cores, one thread decoded SmolLM2 4-6x faster than two.
    """
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 1.5 * cores:
        if note is not None:
            note(f"machine busy (load average {load:.1f} on {cores} cores): using 1 torch thread; "
                 f"pass --threads N to override")
        return 1
    return None


@contextmanager
def torch_threads(threads: int | None, note=None) -> Iterator[None]:
    """Run the block with ``threads`` torch CPU threads (None: :func:`busy_machine_threads`'s choice),
    restoring the caller's setting afterwards: a library call must not change it."""
    import torch

    chosen = threads if threads is not None else busy_machine_threads(note)
    before = torch.get_num_threads()
    if chosen is not None:
        torch.set_num_threads(chosen)
    try:
        yield
    finally:
        torch.set_num_threads(before)

"""The one thread policy of every command: how many torch CPU threads to use on a shared machine.

Every compute command (``data build``, ``train pretrain/convert/distill``, ``eval acceptance/
matrix/sweep/live``, ``export``, ``demo``) has ``--threads N``; without it the run uses torch's
default, except on a machine whose other jobs already keep every core busy (1-minute load
average above 1.5x the cores), where it uses one thread and says so. Lives in ``osprey_data`` so
the builder and the training/evaluation code share it (osprey_data never imports osprey_train).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from osprey_data.errors import ConfigError

__all__ = ["machine_load", "busy_machine_threads", "chosen_threads", "torch_threads", "check_threads", "note_to_stderr",
           "BUSY_LOAD_PER_CORE", "THREADS_HELP"]

BUSY_LOAD_PER_CORE = 1.5
"""A machine is busy when its 1-minute load average exceeds this many runnable jobs per core."""
THREADS_HELP = "torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores)."
"""The help line of every ``--threads`` option not generated from a config field."""


def note_to_stderr(text: str) -> None:
    """Where commands print the policy's note: stderr, so that ``--json`` output stays one document."""
    print(text, file=sys.stderr, flush=True)


def machine_load() -> tuple[float | None, int]:
    """(1-minute load average, or None where the OS has none; CPU cores)."""
    return (os.getloadavg()[0] if hasattr(os, "getloadavg") else None), (os.cpu_count() or 1)


def busy_machine_threads(note: Callable[[str], None] | None = None) -> int | None:
    """1 torch thread when other jobs already keep every core busy, else None (torch's default).

    On a loaded box several OpenMP threads spin-wait for each other; measured here at a load
    average of 5-8 on 2 cores, one thread decoded SmolLM2 4-6x faster than two, and at load ~14
    ``data build`` ran its first batch 4.9x faster with one thread (90 s vs 441 s).
    """
    load, cores = machine_load()
    if load is not None and load > BUSY_LOAD_PER_CORE * cores:
        if note is not None:
            note(f"machine busy (load average {load:.1f} on {cores} cores): using 1 torch thread; "
                 f"pass --threads N to override")
        return 1
    return None


def chosen_threads(threads: int | None, note: Callable[[str], None] | None = None) -> int | None:
    """The policy: an explicit ``threads`` wins; None = :func:`busy_machine_threads`'s choice
    (None again: leave torch's setting)."""
    if threads is not None:
        check_threads(threads)
        return threads
    return busy_machine_threads(note)


def check_threads(threads: int | None, where: str = "") -> None:
    """Raise :class:`ConfigError` unless ``threads`` is None or an integer >= 1 (``where`` prefixes)."""
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"{where}{': ' if where else ''}--threads must be an integer >= 1, got {threads!r}")


@contextmanager
def torch_threads(threads: int | None, note: Callable[[str], None] | None = None) -> Iterator[None]:
    """Run the block with :func:`chosen_threads` torch CPU threads, restoring the caller's
    setting afterwards: a library call must not change it."""
    import torch

    chosen = chosen_threads(threads, note)
    before = torch.get_num_threads()
    if chosen is not None:
        torch.set_num_threads(chosen)
    try:
        yield
    finally:
        torch.set_num_threads(before)

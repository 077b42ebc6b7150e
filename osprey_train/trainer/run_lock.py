"""One live training run per run folder: ``<out>/.osprey-run.lock``, naming its owner.

Two ``train distill`` / ``train pretrain`` runs on one ``--out`` would both append to
``metrics.jsonl``, write interleaved checkpoints and replace each other's ``final/``; each would
still exit 0. So a run takes this lock before it reads or writes anything in its folder, and a
second run refuses at once, naming the pid and host that hold it.

The lock is an ``fcntl.flock`` on the file, which the kernel drops when its owner dies however it
dies (SIGKILL, OOM, a crash): a lock file left by a dead run is stale by construction and simply
taken over, the file then naming the new owner. It works on local disks and on shared
filesystems with working ``flock`` (NFSv4). Only rank 0 of a DDP/FSDP run takes it (all ranks
share one folder); a stage takes it before building anything and the trainer takes it again, so
the hold is re-entrant within one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from osprey_data.errors import ConfigError

__all__ = ["RunBusyError", "run_lock", "LOCK_NAME"]

try:  # pragma: no cover - always present on Linux/macOS
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock (documented)
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".osprey-run.lock"

# resolved run folder -> (fd, depth): re-entrant holds of this process
_HELD: dict[str, list[int]] = {}


class RunBusyError(ConfigError):
    """Another live process is training in this run folder."""


def _owner_text(raw: bytes) -> str:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        return "another process"
    return f"pid {doc.get('pid')} on host {doc.get('host')!r} (since {doc.get('since')})"


def _acquire(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot open the run lock ({exc.strerror}); check --out") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunBusyError(f"{folder}: another training run is using this --out ({_owner_text(os.pread(fd, 4096, 0))}); "
                               "wait for it to finish or stop it, or choose another --out") from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def run_lock(folder: Path, *, rank: int | None = None) -> Iterator[None]:
    """Hold the run lock of ``folder`` (created if missing) for the ``with`` block.

    Raises:
        RunBusyError: another live process holds it (the message names that process).
    """
    if rank is None:
        rank = int(os.environ.get("RANK", "0") or 0)
    if rank != 0 or fcntl is None:
        yield
        return
    key = str(Path(folder).resolve())
    held = _HELD.get(key)
    if held is not None:
        held[1] += 1
    else:
        _HELD[key] = held = [_acquire(Path(folder)), 1]
    try:
        yield
    finally:
        held[1] -= 1
        if held[1] == 0:
            del _HELD[key]
            os.close(held[0])  # drops the flock; the file stays, naming the last owner


def describe_holder(folder: Path) -> dict[str, Any] | None:
    """The owner recorded in ``folder``'s lock file (the last one, live or not), or None."""
    try:
        doc = json.loads((Path(folder) / LOCK_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None

"""One live writer per worker index: ``locks/<worker>.lock``, holding the owner's pid and host.

A writer deletes its own worker's unfinished ``shards/.tmp-<worker>-*`` folders when it opens a
store (they are what a crashed run left). Two processes started with the same worker index would
delete each other's live shard and could commit one whose files are gone. So a
:class:`~osprey_data.store.writer.StoreWriter` takes its worker's lock first and refuses to start
while another live process holds it, naming that process.

Local stores (and shared filesystems with working ``flock``, such as NFSv4): the lock is an
``fcntl.flock`` on the lock file, which the kernel drops when its owner dies however it dies, so
a lock left by a crashed or killed run is stale by construction and simply taken over (the file
still names the last owner, which the new owner reports). Object stores have no such primitive:
there the lock is the lock object itself, created create-only (``If-None-Match: *`` on S3); a
lock naming this host and a pid that no longer runs is stale and replaced, any other is refused
with the owner named and the way out (delete the lock object once that worker is known to be
dead). Two processes replacing the same stale object lock at the same moment could both win; a
crashed worker's lock on an object store is rare enough, and its owner's host named, to leave it
there.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from osprey_data.errors import StoreError
from osprey_data.store.fs import StoreFS

__all__ = ["WorkerLock", "WorkerBusyError", "lock_path"]

try:  # pragma: no cover - always present on Linux/macOS
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class WorkerBusyError(StoreError):
    """Another live process is writing this store as the same worker."""


def lock_path(worker: str) -> str:
    return f"locks/{worker}.lock"


def _owner() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _describe(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "another process"
    return f"pid {owner.get('pid')} on host {owner.get('host')!r} (since {owner.get('since')})"


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


class WorkerLock:
    """The lock of ``worker`` in the store ``fs``; :meth:`acquire` once, :meth:`release` once."""

    def __init__(self, fs: StoreFS, worker: str) -> None:
        self.fs, self.worker, self.rel = fs, worker, lock_path(worker)
        self._fd: int | None = None
        self.taken_over: dict[str, Any] | None = None
        """The previous owner of a stale lock this one replaced (None: there was none)."""

    def _busy(self, owner: dict[str, Any] | None) -> WorkerBusyError:
        return WorkerBusyError(
            f"{self.fs.where(self.rel)}: worker {self.worker} is already writing this store ({_describe(owner)}); "
            f"two writers with the same worker index would delete each other's unfinished shards. Wait for it "
            f"to finish or stop it, or give this run another --worker-index")

    def _damaged(self, raw: bytes) -> WorkerBusyError:
        shown = raw[:40].decode("utf-8", "replace")
        return WorkerBusyError(
            f"{self.fs.where(self.rel)}: the lock object of worker {self.worker} is damaged (it holds {shown!r}, not "
            f"the JSON owner record a writer leaves: pid, host, since), so its owner is unknown. If no writer of "
            f"worker {self.worker} is running, delete that object and run again; otherwise give this run another "
            f"--worker-index")

    def acquire(self) -> None:
        if self.fs.is_local and fcntl is not None:
            self._acquire_flock()
        else:
            self._acquire_object()

    def _acquire_flock(self) -> None:
        locks = self.fs.path("locks")
        if not os.path.islink(locks):
            self.fs.makedirs("locks")
        if os.path.islink(locks) or not os.path.isdir(locks):   # a planted symlink would put locks elsewhere
            raise StoreError(f"{self.fs.where('locks')}: must be a plain folder of the store, not a symlink or a "
                             "file; remove it (a writer recreates it)")
        path = self.fs.path(self.rel)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise self._busy(_parse(os.pread(fd, 65536, 0))) from None
            previous = _parse(os.pread(fd, 65536, 0))
            if previous and previous.get("pid") != os.getpid():
                self.taken_over = previous  # its owner is gone: the kernel dropped its flock
            data = json.dumps(_owner()).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _acquire_object(self) -> None:
        for _ in range(2):
            try:
                self.fs.write_atomic(self.rel, json.dumps(_owner()).encode(), create_only=True)
                return
            except FileExistsError:
                raw = self.fs.read_bytes(self.rel) if self.fs.exists(self.rel) else None
                owner = _parse(raw) if raw is not None else None
                if raw is not None and (owner is None or not {"pid", "host"} <= set(owner)):
                    raise self._damaged(raw) from None
            same_host = owner is not None and owner.get("host") == socket.gethostname()
            if not (same_host and isinstance(owner.get("pid"), int) and not _pid_alive(owner["pid"])):
                raise self._busy(owner)
            self.taken_over = owner  # its process is gone: replace the lock
            self.fs.remove_file(self.rel)
        raise self._busy(None)

    def release(self) -> None:
        """Give the lock up (the file stays, naming the last owner; its flock is what counts)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # drops the flock
        elif not self.fs.is_local or fcntl is None:
            owner = _parse(self.fs.read_bytes(self.rel)) if self.fs.exists(self.rel) else None
            if owner is not None and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
                self.fs.remove_file(self.rel)

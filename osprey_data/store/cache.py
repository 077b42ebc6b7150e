"""Local cache of a remote store's committed shard files, and background prefetch of shards.

Training reads every sample once per epoch in a shuffled order; from object storage each read
is several HTTP round trips. Committed shards never change — every file's size and CRC32C are
in the shard's ``_COMMIT.json``, whose sha256 is in the manifest — so their files can be kept
on local disk and read from there from the second touch on.

Safety:

* cached copies are keyed by shard id AND the commit record's sha256: a shard rebuilt under
  the same id is another key, never a stale hit;
* a copy read from the cache is checked against the commit record (the commit record itself
  against the manifest's sha256; tables and metadata by size + CRC32C; chunks by size here,
  since the reader CRC-checks every chunk it decodes anyway — when that check fails on a
  cached shard, ``StoreReader`` drops the shard's copy and reads the store again); a damaged
  copy is dropped and fetched again, so a broken local disk never passes for a corrupt store;
* files are written by temp file + rename, shard folders evicted by rename-then-delete: several
  processes may share one cache folder (see :class:`ShardFileCache`);
* copies are read like store files (regular files only, size-checked, no final symlink): a
  FIFO, device or link planted in the cache is dropped, never read;
* a cache disk that is full or read-only turns caching off with one logged warning; reads go
  on from the store;
* ``manifest.json`` and journals are never cached (readers always see the current manifest).

Layout: ``CACHE/<sha256(store url)[:16]>/<shard id>-<commit sha256[:16]>/<file in the shard>``
(plus ``source.txt`` naming the store). Size: at most ``max_bytes`` per store; past it the
least recently opened shards are deleted.

Prefetch: when a reader opens shard ``k`` it asks one background thread to download all files
of shards ``k`` and ``k + 1`` that are not cached yet (a few files per request, in parallel
through fsspec's ``cat``), so sequential readers find the next shard local and shuffled ones
get the rest of a shard in bulk after its first sample.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import math
import os
import queue
import shutil
import stat
import threading
import uuid
import zlib
from pathlib import Path
from typing import Any

import google_crc32c

from osprey_data import jsonio
from osprey_data.atomic import temp_name
from osprey_data.errors import ConfigError, StoreCorruptError, StoreNotFoundError
from osprey_data.store.fs import StoreFS
from osprey_data.store.manifest import ShardInfo

__all__ = ["CACHE_ENV", "CACHE_MAX_ENV", "ShardFileCache", "CachedShardFS", "ShardPrefetcher", "PREFETCHER",
           "open_cache", "default_cache_root"]

CACHE_ENV = "OSPREY_STORE_CACHE"
"""Cache folder for remote stores, or ``off``; default ``$OSPREY_CACHE/stores`` or
``~/.cache/osprey/stores``."""
CACHE_MAX_ENV = "OSPREY_STORE_CACHE_MAX_GB"
"""Size limit per store in GB; default: half the free space of the cache's disk when opened."""

log = logging.getLogger(__name__)

COMMIT_FILE = "_COMMIT.json"  # same name as shard.COMMIT_FILE (shard imports this package's fs)
_PREFETCH_BATCH = 8  # files fetched concurrently by one prefetch request (~2 MiB chunks each)


def _intact(data: bytes, entry: dict[str, Any]) -> bool:
    if len(data) != entry["bytes"]:
        return False
    if "crc32c" in entry:
        return google_crc32c.value(data) == entry["crc32c"]
    return zlib.crc32(data) == entry["crc32"]


def default_cache_root() -> Path | None:
    """Where remote stores are cached (None: caching turned off by ``OSPREY_STORE_CACHE=off``)."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env.lower() in ("off", "0", "none", "false"):
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("OSPREY_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "osprey") / "stores"


def _write_file(path: str, data: bytes) -> None:
    """Write ``data`` into the new file ``path``: the one place the cache writes file contents
    (without fsync: a cached copy needs no durability, one torn by a power loss fails its check
    and is fetched again, and an fsync per chunk would slow down the first epoch)."""
    with open(path, "xb") as f:
        f.write(data)


def _tree_bytes(top: str) -> int:
    """Bytes of the regular files under ``top``, tolerating files other processes delete meanwhile."""
    total = 0
    for dirpath, _, files in os.walk(top):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


_MIN_DERIVED_BYTES = 1 << 20
"""Below this, a size limit derived from a full disk is no cache (only ``source.txt`` fits)."""


def _cache_size_limit() -> int | None:
    env = os.environ.get(CACHE_MAX_ENV)
    if not env:
        return None
    try:
        gb = float(env)
    except ValueError:
        gb = math.nan
    if not math.isfinite(gb) or gb <= 0:
        raise ConfigError(f"{CACHE_MAX_ENV}={env!r}: expected a positive, finite size in GB (e.g. 20)")
    return max(1, int(gb * 1e9))


class ShardFileCache:
    """Local copies of committed shard files of one store.

    Shared by processes (DataLoader workers, concurrent jobs) without a lock service: files
    appear by temp file + rename, a shard folder is evicted by renaming it away first (one
    process wins, the others see it gone) and then deleting the renamed copy, one evicting
    process at a time (a non-blocking ``flock``; the others skip), and every step tolerates
    another process having removed or created the same path meanwhile. The size is counted
    per process and recounted from disk before evicting.

    Copies are read through the store's own path resolver (:class:`StoreFS` on the cache
    folder): regular files only, never through a final symlink, size-checked before reading,
    so a FIFO, a device or a link planted in the cache is dropped, never read.

    A disk that refuses writes (full, read-only, quota) turns caching off for this cache
    with one logged warning; reads go on uncached (a documented degradation).
    """

    def __init__(self, root: str | os.PathLike, store_url: str, *, max_bytes: int | None = None) -> None:
        self.dir = Path(root) / hashlib.sha256(store_url.rstrip("/").encode()).hexdigest()[:16]
        self.store_url = store_url
        if max_bytes is None:
            max_bytes = _cache_size_limit()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._root = str(self.dir)
        self._files = StoreFS(self._root, read_only=True)
        source = self.dir / "source.txt"
        if not source.exists():
            source.write_text(store_url + "\n", encoding="utf-8")
        if max_bytes is None:   # no limit set: half the free space (plus what is cached already)
            share = shutil.disk_usage(self.dir).free // 2
            max_bytes = share + self._scan()
            if share <= 0 and max_bytes < _MIN_DERIVED_BYTES:
                # a full disk, not a limit anyone set (and too little cached to be of use): read uncached
                raise OSError(errno.ENOSPC, f"no free space for a store cache in {self.dir} (no "
                                            f"{CACHE_MAX_ENV} set, and half the free space is 0 bytes)")
        if max_bytes <= 0:
            raise ConfigError(f"store cache size limit must be positive, got {max_bytes} bytes")
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._bytes: int | None = None
        self.disabled: str | None = None
        """Why this cache stopped writing (the disk refused a write), or None."""

    def shard_dir(self, info: ShardInfo) -> Path:
        return self.dir / f"{info.shard_id}-{info.commit_sha256[:16]}"

    def _rel(self, info: ShardInfo, rel: str) -> str:
        return f"{info.shard_id}-{info.commit_sha256[:16]}/{rel}"

    def _file(self, info: ShardInfo, rel: str) -> str:
        # plain strings: this is on the read path of every cached chunk (pathlib costs ~10 us)
        return f"{self._root}/{info.shard_id}-{info.commit_sha256[:16]}/{rel}"

    def get(self, info: ShardInfo, rel: str, entry: dict[str, Any] | None = None) -> bytes | None:
        """The cached copy of ``rel`` in shard ``info`` when present and intact, else None
        (a damaged copy, or anything but a regular file, is deleted). ``entry`` is the file's
        size + CRC from the commit record; the commit record itself is checked against the
        manifest's sha256."""
        if rel != COMMIT_FILE and entry is None:
            return None
        try:
            data = self._files.read_bytes(self._rel(info, rel), size=None if rel == COMMIT_FILE else entry["bytes"])
        except StoreNotFoundError:
            return None
        except (StoreCorruptError, OSError):  # special file, link, wrong size, folder in the way
            data = None
        if data is None:
            ok = False
        elif rel == COMMIT_FILE:
            ok = hashlib.sha256(data).hexdigest() == info.commit_sha256
        elif "/c/" in rel:  # a chunk: the reader's own CRC check follows (see the module doc)
            ok = True  # the size was checked by read_bytes
        else:
            ok = _intact(data, entry)
        if not ok:  # damaged, stale or planted local copy: fetch again
            self._discard(self._file(info, rel))
            return None
        return data

    def _discard(self, p: str) -> None:
        """Remove what is at ``p`` without following links, only when ``p`` lies in the cache."""
        real = os.path.realpath(os.path.dirname(p))
        if not (real + os.sep).startswith(os.path.realpath(self._root) + os.sep):
            return
        try:
            os.unlink(p)
        except (IsADirectoryError, PermissionError):
            shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass  # gone already, or a read-only disk: the store is read instead

    def has(self, info: ShardInfo, rel: str) -> bool:
        return os.path.isfile(self._file(info, rel))

    def put(self, info: ShardInfo, rel: str, data: bytes) -> None:
        """Store a copy (already verified by the caller) atomically, by temp file + rename.

        Another process evicting the shard meanwhile leaves this copy out (the file is read
        from the store next time); a disk that refuses the write turns the cache off."""
        if self.disabled is not None:
            return
        p = self._files.path(self._rel(info, rel))  # the store's path rules: no '..', no absolute
        for _ in range(3):
            tmp = str(temp_name(p))
            try:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                try:
                    _write_file(tmp, data)
                    os.replace(tmp, p)
                finally:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
            except (FileNotFoundError, FileExistsError, NotADirectoryError):
                continue  # its folder was evicted (or replaced) by another process meanwhile
            except IsADirectoryError:
                self._discard(p)  # a folder planted where the file goes
                continue
            except OSError as exc:
                self._degrade(exc)
                return
            self._account(len(data), keep=info)
            return

    def _degrade(self, exc: OSError) -> None:
        with self._lock:
            if self.disabled is not None:
                return
            self.disabled = f"{type(exc).__name__}: {exc}"
        log.warning("store cache %s cannot be written (%s); reading %s uncached from now on "
                    "(free space there, or point %s elsewhere or to 'off')",
                    self.dir, self.disabled, self.store_url, CACHE_ENV)

    def drop(self, info: ShardInfo) -> None:
        """Forget every cached file of a shard (a copy failed its check)."""
        self._remove_dir(self.shard_dir(info))
        with self._lock:
            self._bytes = None  # rescanned at the next insert

    def _remove_dir(self, d: Path) -> int:
        """Delete shard folder ``d``: renamed away first, so that no other process writes into
        or counts a half-deleted folder and only one of several evicting processes deletes it.
        Returns the bytes freed (0 when another process took it first)."""
        gone = d.with_name(f".evicted-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(d, gone)
        except OSError:
            return 0
        size = _tree_bytes(str(gone))
        shutil.rmtree(gone, ignore_errors=True)
        return size

    def touch(self, info: ShardInfo) -> None:
        """Mark a shard as just used (eviction removes the least recently used first)."""
        with contextlib.suppress(OSError):
            os.utime(self.shard_dir(info), follow_symlinks=False)

    def _scan(self) -> int:
        return _tree_bytes(str(self.dir))

    def _account(self, n: int, *, keep: ShardInfo) -> None:
        with self._lock:
            if self._bytes is None:
                self._bytes = self._scan()
            else:
                self._bytes += n
            if self._bytes <= self.max_bytes:
                return
            self._bytes = self._scan()  # other processes add and evict too: count what is there
            if self._bytes <= self.max_bytes:
                return
            try:
                lock = open(self.dir / ".evict.lock", "a+b")  # noqa: SIM115 - held while evicting
            except OSError:
                return
            with lock:
                try:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return  # another process is evicting right now
                self._evict(keep)

    def _evict(self, keep: ShardInfo) -> None:
        """Least recently opened shards first, down to 90 % of the limit; never ``keep``."""
        keep_name = self.shard_dir(keep).name
        dirs = []
        with os.scandir(self.dir) as it:
            for e in it:
                if e.name.startswith(".evicted-"):  # left by a process that died while evicting
                    shutil.rmtree(e.path, ignore_errors=True)
                    continue
                if e.name.startswith(".") or e.name == keep_name:
                    continue
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        dirs.append((st.st_mtime, e.name))
        target = int(self.max_bytes * 0.9)
        for _, name in sorted(dirs):
            if self._bytes <= target:
                break
            self._bytes -= self._remove_dir(self.dir / name)


class CachedShardFS:
    """Stands in for the store's :class:`StoreFS` under one shard's reader: files of the
    committed shard come from the local cache, or from the store on a miss (then cached)."""

    def __init__(self, fs: StoreFS, cache: ShardFileCache, info: ShardInfo) -> None:
        self._fs, self._cache, self._info = fs, cache, info
        self._prefix = f"shards/{info.shard_id}/"
        self._entries: dict[str, dict[str, Any]] | None = None
        cache.touch(info)

    def __getattr__(self, name: str) -> Any:  # url, read_only, where, ... of the store
        return getattr(self._fs, name)

    def entries(self) -> dict[str, dict[str, Any]]:
        """The shard's files (size + CRC) from its verified commit record."""
        if self._entries is None:
            self.read_bytes(self._prefix + COMMIT_FILE)
        return self._entries or {}

    def read_bytes(self, rel: str, *, size: int | None = None) -> bytes:
        """As :meth:`StoreFS.read_bytes` (``size``: the commit record's, checked before reading)."""
        if not rel.startswith(self._prefix):
            return self._fs.read_bytes(rel, size=size)
        inner = rel[len(self._prefix):]
        if inner == COMMIT_FILE:
            data = self._cache.get(self._info, COMMIT_FILE)
            if data is None:
                data = self._fs.read_bytes(rel)
                if hashlib.sha256(data).hexdigest() != self._info.commit_sha256:
                    return data  # the store's own copy is wrong: the shard reader reports it
                self._cache.put(self._info, COMMIT_FILE, data)
            try:
                self._entries = dict(jsonio.loads(data)["files"])
            except (ValueError, KeyError, TypeError):
                self._entries = {}  # malformed record: the shard reader reports it
            return data
        entry = self.entries().get(inner)
        data = self._cache.get(self._info, inner, entry) if entry is not None else None
        if data is None:
            data = self._fs.read_bytes(rel, size=size)
            if entry is not None and _intact(data, entry):
                self._cache.put(self._info, inner, data)
        return data

    def prefetch(self) -> None:
        """Download every file of the shard that is not cached yet (runs on the prefetch thread)."""
        missing = [rel for rel in self.entries() if not self._cache.has(self._info, rel)]
        for i in range(0, len(missing), _PREFETCH_BATCH):
            batch = missing[i:i + _PREFETCH_BATCH]
            paths = {self._fs.path(self._prefix + rel): rel for rel in batch}
            got = self._fs.fs.cat(list(paths), on_error="omit")
            for path, data in got.items():
                rel = paths.get(path) or paths.get(path.lstrip("/"))
                entry = self._entries.get(rel) if rel and self._entries else None
                if entry is not None and isinstance(data, bytes) and _intact(data, entry):
                    self._cache.put(self._info, rel, data)


class ShardPrefetcher:
    """One background thread downloading whole shards into caches, in the order requested.

    Errors are swallowed on purpose: a prefetch is only a hint, and the foreground read of the
    same file reports any real problem (missing, corrupt, denied) with its usual message.
    Fork-safe: a child process (DataLoader worker) starts its own thread on first use.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._cond = threading.Condition()
        self._pending = 0
        self._queue: queue.Queue = queue.Queue()
        self._requested: set[tuple[str, str, str]] = set()

    def request(self, shard_fs: CachedShardFS) -> None:
        info = shard_fs._info
        key = (str(shard_fs._cache.dir), info.shard_id, info.commit_sha256)
        with self._cond:
            if os.getpid() != self._pid:  # first use, or in a forked child
                self._pid, self._pending = os.getpid(), 0
                self._queue, self._requested = queue.Queue(), set()
                threading.Thread(target=self._run, args=(self._queue,), name="osprey-prefetch",
                                 daemon=True).start()
            if key in self._requested:
                return
            self._requested.add(key)
            self._pending += 1
            self._queue.put(shard_fs)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every requested shard was handled (tests, benchmarks)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def _run(self, q: queue.Queue) -> None:
        while True:
            shard_fs = q.get()
            try:
                shard_fs.prefetch()
            except Exception:  # noqa: BLE001 - see the class docstring
                pass
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()


PREFETCHER = ShardPrefetcher()
"""The process's prefetch thread, shared by every reader."""


def open_cache(fs: StoreFS, cache: str | os.PathLike | bool | None) -> ShardFileCache | None:
    """The cache a reader of ``fs`` uses: ``None``/``"auto"`` = the default folder for remote
    stores (none for local and ``memory://`` ones), ``False``/``"off"`` = none, a path = there."""
    if cache is False or (isinstance(cache, str) and cache.lower() == "off"):
        return None
    if cache is None or cache is True or cache == "auto":
        if not fs.is_remote and cache is not True:
            return None
        root = default_cache_root()
        if root is None:
            return None
    else:
        root = Path(cache).expanduser()
    try:
        return ShardFileCache(root, fs.url)
    except OSError as exc:  # read-only, full or not a folder: a documented degradation
        log.warning("store cache %s cannot be used (%s: %s); reading %s uncached (point %s elsewhere "
                    "or to 'off')", root, type(exc).__name__, exc, fs.url, CACHE_ENV)
        return None

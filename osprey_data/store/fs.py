"""Filesystem access for stores: local paths and fsspec URLs, atomic writes, read-only mode.

One small wrapper (:class:`StoreFS`) so that the writer, reader, merge and validate code never
touch fsspec directly. Atomicity differs by backend and is decided here:

* local disk: a file is replaced through :func:`osprey_data.atomic.write_bytes` (temporary
  sibling, fsync, ``os.replace``); a shard directory is built under ``shards/.tmp-...`` and
  renamed in one step.
* object stores (``s3://``, ``memory://``, ...): a single object PUT is atomic, directories do
  not exist, so files are written in place and a shard counts as committed only once its
  ``_COMMIT.json`` (written last, create-only) exists — and is visible only once listed by the
  manifest.

``manifest.json`` is the one file several processes may replace (merges, a single writer). It is
updated by compare-and-swap (:meth:`StoreFS.read_for_update` / :meth:`StoreFS.replace_if_unchanged`):
on S3 with conditional PUTs (``If-Match`` on the ETag read, ``If-None-Match: *`` to create), on
local disk under an ``flock`` with a content check, in ``memory://`` under a process lock. Other
fsspec backends get a check-then-write with a warning that it is not atomic.

A read-only StoreFS refuses every mutating call with StoreReadOnlyError (readers use it); a
write the storage itself refuses (read-only credentials or mount) is a StoreReadOnlyError too,
naming the location. Credentials never appear in messages: they come from the environment or
fsspec's configuration, and a URL with an embedded password is refused.

Every path goes through one resolver (:meth:`StoreFS.path`): relative, ``/``-separated, no
``.``/``..``/empty components, so nothing named in a crafted manifest, journal or commit record
can point outside the store. Local reads (:meth:`StoreFS.read_bytes`) then open without
following a final symlink and without blocking, refuse anything but a regular file (a FIFO
would hang, ``/dev/zero`` would never end, a directory is no chunk), refuse a file whose
directory resolves outside the store, and check the size before reading: against the commit
record's size when the caller knows it, else against :data:`MAX_METADATA_BYTES`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import threading
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem

from osprey_data.atomic import write_bytes
from osprey_data.errors import ConfigError, StoreCorruptError, StoreError, StoreNotFoundError, StoreReadOnlyError

__all__ = ["StoreFS", "Versioned", "MAX_METADATA_BYTES"]

# The largest file read without a size from a commit record (manifest, journals, commit records):
# a million shards' manifest is ~300 MB; a crafted one cannot make a reader allocate more.
MAX_METADATA_BYTES = 1 << 30

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return name
    return "special file"  # pragma: no cover

# memory:// lives in this process: one lock serialises its compare-and-swap updates.
_MEMORY_LOCK = threading.Lock()
_LOCK_FILE = ".osprey.lock"


def _precondition_failed(exc: BaseException) -> bool:
    """Whether an s3fs error is the server's 412 (a conditional PUT lost a race); s3fs turns it
    into FileExistsError (If-None-Match) or a plain OSError (If-Match), keeping the cause."""
    if isinstance(exc, FileExistsError):
        return True
    seen = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            err = response.get("Error", {})
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return err.get("Code") in ("PreconditionFailed", "412") or status == 412
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(frozen=True)
class Versioned:
    """A file's content (None: absent) and the version token a conditional replace checks."""

    data: bytes | None
    token: str | None


class StoreFS:
    """A store root on some filesystem, with paths relative to that root."""

    def __init__(self, url: str, *, storage_options: dict | None = None, read_only: bool) -> None:
        self.url = str(url)
        self.read_only = read_only
        parts = urlsplit(self.url)
        if parts.scheme and parts.password is not None:
            # the URL ends up in manifests' error messages, logs and reports
            raise ConfigError(f"store URL {parts.scheme}://{parts.hostname}{parts.path} embeds credentials; "
                              "remove them and pass credentials through the environment (e.g. "
                              "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) or fsspec's configuration")
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise StoreError(f"cannot open store location {self.url!r}: {exc} "
                             "(for s3:// install the 's3' extra)") from None
        self.root = root.rstrip("/") or "/"
        self.is_local = isinstance(self.fs, LocalFileSystem)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.is_memory = "memory" in protocols
        self.is_s3 = "s3" in protocols
        self.is_remote = not (self.is_local or self.is_memory)
        """Data crosses a network: worth a local cache (see ``cache.py``)."""
        self._real_root: str | None = None
        self._inside: set[str] = set()  # directories already resolved to inside the store

    # --- paths --------------------------------------------------------------------------

    def path(self, rel: str) -> str:
        """The full path of ``rel``; StoreCorruptError when ``rel`` could leave the store."""
        if rel:
            parts = rel.split("/")
            if rel.startswith("/") or "\\" in rel or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
                raise StoreCorruptError(f"{self.url.rstrip('/')}: refusing path {rel!r}: store paths are relative, "
                                        "without '.', '..' or empty parts (a damaged or crafted store)")
        return f"{self.root}/{rel}" if rel else self.root

    def where(self, rel: str) -> str:
        """Human-readable location of ``rel`` for error messages."""
        return f"{self.url.rstrip('/')}/{rel}"

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreReadOnlyError(f"refusing to {what} in {self.url}: opened read-only")

    @contextlib.contextmanager
    def _writing(self, rel: str, what: str) -> Iterator[None]:
        """Turn the storage's own refusal (read-only credentials, bucket policy, read-only
        mount) into one clear error naming the location; the storage's message is kept (it
        names the denied action, never the credentials)."""
        self._check_writable(what)
        try:
            yield
        except PermissionError as exc:
            raise StoreReadOnlyError(
                f"{self.where(rel)}: the storage refused to {what} ({type(exc).__name__}: {exc}). "
                f"{self.url} is read-only for this process (credentials, bucket policy or mount); "
                "run this command with write access — reading commands (validate, inspect, "
                "train, eval) need none") from None

    def _fresh(self, p: str) -> None:
        # Listings are cached per filesystem instance; other processes change the store, so a
        # cached listing would hide their journals and shards.
        if not self.is_local:
            self.fs.invalidate_cache(p)

    def check_writable(self) -> None:
        """Fail now, naming the store, when its storage refuses writes or deletes (a probe
        object is written and removed) — before hours of work that would end in a refused write."""
        rel = f".osprey-write-probe-{uuid.uuid4().hex[:12]}"
        with self._writing(rel, "write"):
            if self.is_local:
                os.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(self.path(rel), b"probe")
        with self._writing(rel, "delete"):
            self.fs.rm_file(self.path(rel))

    # --- reads ----------------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        self._fresh(self.path(rel))
        return bool(self.fs.exists(self.path(rel)))

    def check_root(self) -> None:
        """StoreNotFoundError unless a local store root exists and is a folder."""
        if not self.is_local:
            return
        if not os.path.lexists(self.root):
            raise StoreNotFoundError(f"{self.url}: does not exist")
        if not os.path.isdir(self.root):
            raise StoreNotFoundError(f"{self.url}: is a file, not a store folder")

    def _check_inside(self, p: str, rel: str) -> None:
        """The folder holding ``p`` must resolve inside the store (a symlinked shard folder may
        live elsewhere on disk only if it resolves under the store's own root)."""
        folder = os.path.dirname(p)
        if folder in self._inside:
            return
        if self._real_root is None:
            self._real_root = os.path.realpath(self.root)
        real = os.path.realpath(folder)
        if real != self._real_root and not real.startswith(self._real_root.rstrip(os.sep) + os.sep):
            raise StoreCorruptError(f"{self.where(rel)}: its folder resolves to {real}, outside the store; "
                                    "refusing to read it (a damaged or crafted store)")
        self._inside.add(folder)

    def read_bytes(self, rel: str, *, size: int | None = None) -> bytes:
        """The bytes of the regular file ``rel``.

        Args:
            size: the size the commit record gives; a file of another size is StoreCorruptError
                before a byte is read. Without it the file may hold at most MAX_METADATA_BYTES.
        """
        limit = MAX_METADATA_BYTES if size is None else size
        p = self.path(rel)
        if not self.is_local:
            try:
                # at most one byte more than allowed: enough to tell a padded file
                data = self.fs.cat_file(p, start=0, end=limit + 1)
            except FileNotFoundError:
                raise StoreNotFoundError(f"{self.where(rel)}: missing") from None
            except IsADirectoryError:
                raise StoreCorruptError(f"{self.where(rel)}: is a directory, not a file") from None
            self._check_size(rel, len(data), size)
            return data
        self._check_inside(p, rel)
        try:
            # plain os-level open/read: fsspec's cat_file adds an opener object and seeks per
            # call, which shows up when every chunk of every sample is read
            fd = os.open(p, _OPEN_FLAGS)
        except FileNotFoundError:
            raise StoreNotFoundError(f"{self.where(rel)}: missing") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreCorruptError(f"{self.where(rel)}: is a symbolic link; store files are regular "
                                        "files (a damaged or crafted store)") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreCorruptError(f"{self.where(rel)}: is a {_file_kind(st.st_mode)}, not a regular file "
                                        "(a damaged or crafted store); refusing to read it")
            self._check_size(rel, st.st_size, size)
        except BaseException:
            os.close(fd)
            raise
        with open(fd, "rb", closefd=True) as f:
            data = f.read(st.st_size + 1)
        self._check_size(rel, len(data), size)  # changed while we read
        return data

    def _check_size(self, rel: str, actual: int, size: int | None) -> None:
        if size is not None and actual != size:
            raise StoreCorruptError(f"{self.where(rel)}: is truncated or padded ({actual} bytes, expected {size})")
        if actual > MAX_METADATA_BYTES and size is None:
            raise StoreCorruptError(f"{self.where(rel)}: {actual} bytes, more than any store metadata file may "
                                    f"hold ({MAX_METADATA_BYTES}); refusing to read it")

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        try:
            return self.fs.cat_file(self.path(rel), start=start, end=end)
        except FileNotFoundError:
            raise StoreNotFoundError(f"{self.where(rel)}: missing") from None

    def size(self, rel: str) -> int:
        return int(self.fs.size(self.path(rel)))

    def listdir(self, rel: str) -> list[str]:
        """Names (not paths) directly under ``rel``; empty when it does not exist."""
        p = self.path(rel)
        self._fresh(p)
        try:
            entries = self.fs.ls(p, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            name = str(e).rstrip("/").rsplit("/", 1)[-1]
            if name and str(e).rstrip("/") != p.rstrip("/"):
                out.append(name)
        return sorted(set(out))

    def walk_files(self, rel: str) -> list[str]:
        """All files under ``rel`` as paths relative to ``rel``."""
        base = self.path(rel).rstrip("/")
        self._fresh(base)
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        out = []
        for f in found:
            f = str(f)
            # fsspec memory paths may come back with a leading slash
            idx = f.find(base.lstrip("/"))
            tail = f[idx + len(base.lstrip("/")):] if idx >= 0 else f
            out.append(tail.lstrip("/"))
        return sorted(o for o in out if o)

    # --- writes ---------------------------------------------------------------------------

    def makedirs(self, rel: str) -> None:
        with self._writing(rel, "create a directory"):
            if self.is_local:
                os.makedirs(self.path(rel), exist_ok=True)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Plain write (inside a not-yet-committed shard)."""
        with self._writing(rel, "write"):
            if self.is_local:
                p = self.path(rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                try:
                    with open(p, "wb") as f:
                        f.write(data)
                except OSError as exc:
                    if exc.filename is None:
                        exc.filename = p  # a full disk's write() error names no file of its own
                    raise
            else:
                self.fs.pipe_file(self.path(rel), data)

    def write_atomic(self, rel: str, data: bytes, *, create_only: bool = False) -> None:
        """Replace ``rel`` so readers see the old or the new content, never a mix.

        ``create_only``: fail with ``FileExistsError`` when ``rel`` exists (on S3 checked by
        the server: ``If-None-Match: *``), e.g. a shard's commit record, which is never replaced.
        """
        with self._writing(rel, "write"):
            p = self.path(rel)
            if create_only and self.is_s3:
                try:
                    self.fs.pipe_file(p, data, IfNoneMatch="*")
                except OSError as exc:
                    if _precondition_failed(exc):
                        raise FileExistsError(self.where(rel)) from None
                    raise
            elif create_only:
                with self._update_lock():
                    if self.exists(rel):
                        raise FileExistsError(self.where(rel))
                    self._replace(p, data)
            else:
                self._replace(p, data)

    def _replace(self, p: str, data: bytes) -> None:
        if self.is_local:
            write_bytes(p, data)
        else:
            self.fs.pipe_file(p, data)  # one PUT: atomic on object stores

    # --- compare-and-swap (manifest.json) --------------------------------------------------

    @contextlib.contextmanager
    def _update_lock(self) -> Iterator[None]:
        """Serialises conditional replaces where the storage cannot check a version itself."""
        if self.is_local:
            os.makedirs(self.root, exist_ok=True)
            try:   # never through a symlink planted in the store: it could create or lock a file elsewhere
                fd = os.open(self.path(_LOCK_FILE), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                             | getattr(os, "O_CLOEXEC", 0), 0o666)
            except OSError as exc:
                raise StoreCorruptError(f"{self.where(_LOCK_FILE)}: cannot open the store's update lock "
                                        f"({exc.strerror}); it must be a plain file (a symlink is refused)") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        elif self.is_memory:
            with _MEMORY_LOCK:
                yield
        else:
            yield

    def read_for_update(self, rel: str) -> Versioned:
        """``rel``'s content and a version token for :meth:`replace_if_unchanged`.

        On S3 the token is the ETag, read BEFORE the content: if the object changes in
        between, the token is older than the content and the conditional PUT fails (safe);
        the other order could pair new content with a stale-looking version.
        """
        p = self.path(rel)
        self._fresh(p)
        if self.is_s3:
            try:
                etag = self.fs.info(p)["ETag"]
                return Versioned(self.fs.cat_file(p), etag)
            except FileNotFoundError:
                return Versioned(None, None)
        try:
            data = self.read_bytes(rel)
        except StoreNotFoundError:
            return Versioned(None, None)
        return Versioned(data, hashlib.sha256(data).hexdigest())

    def replace_if_unchanged(self, rel: str, data: bytes, token: str | None) -> bool:
        """Write ``data`` to ``rel`` only if it still has version ``token`` (None: only if it
        does not exist). False when another process changed it first; the caller re-reads."""
        with self._writing(rel, "write"):
            p = self.path(rel)
            if self.is_s3:
                try:
                    if token is None:
                        self.fs.pipe_file(p, data, IfNoneMatch="*")
                    else:
                        self.fs.pipe_file(p, data, IfMatch=token)
                except OSError as exc:
                    if _precondition_failed(exc):
                        return False
                    raise
                finally:
                    self._fresh(p)
                return True
            if not (self.is_local or self.is_memory):
                warnings.warn(f"{self.url}: {self.fs.protocol} has no conditional write here; "
                              f"{rel} is replaced by check-then-write, so concurrent merges are not "
                              "safe on this storage (run one at a time)", stacklevel=2)
            with self._update_lock():
                if self.read_for_update(rel).token != token:
                    return False
                self._replace(p, data)
                return True

    def rename_dir(self, src: str, dst: str) -> None:
        if not self.is_local:
            raise StoreError("directory rename is only used on local stores")
        with self._writing(dst, "rename"):
            os.rename(self.path(src), self.path(dst))

    def remove_tree(self, rel: str) -> None:
        with self._writing(rel, "delete"):
            if self.exists(rel):
                self.fs.rm(self.path(rel), recursive=True)

    def remove_file(self, rel: str) -> None:
        with self._writing(rel, "delete"):
            try:
                self.fs.rm_file(self.path(rel))
            except FileNotFoundError:
                pass

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "protocol": self.fs.protocol, "local": self.is_local}

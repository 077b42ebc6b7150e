"""Filesystem access for stores: local paths and fsspec URLs, atomic writes, read-only mode.

One small wrapper (:class:`StoreFS`) so that the writer, reader, merge and validate code never
touch fsspec directly. Atomicity differs by backend and is decided here:

* local disk: a file is replaced through :func:`osprey_data.atomic.write_bytes` (temporary
  sibling, fsync, ``os.replace``); a shard directory is built under ``shards/.tmp-...`` and
  renamed in one step.
* object stores (``s3://``, ``memory://``, ...): a single object PUT is atomic, directories do
  not exist, so files are written in place and a shard counts as committed only once its
  ``_COMMIT.json`` (written last) exists — and is visible only once listed by the manifest.

A read-only StoreFS refuses every mutating call with StoreReadOnlyError (readers use it).
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from osprey_data.atomic import write_bytes
from osprey_data.errors import StoreError, StoreNotFoundError, StoreReadOnlyError

__all__ = ["StoreFS"]


class StoreFS:
    """A store root on some filesystem, with paths relative to that root."""

    def __init__(self, url: str, *, storage_options: dict | None = None, read_only: bool) -> None:
        self.url = str(url)
        self.read_only = read_only
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise StoreError(f"cannot open store location {self.url!r}: {exc} "
                             "(for s3:// install the 's3' extra)") from None
        self.root = root.rstrip("/") or "/"
        self.is_local = isinstance(self.fs, LocalFileSystem)

    # --- paths --------------------------------------------------------------------------

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def where(self, rel: str) -> str:
        """Human-readable location of ``rel`` for error messages."""
        return f"{self.url.rstrip('/')}/{rel}"

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreReadOnlyError(f"refusing to {what} in {self.url}: opened read-only")

    # --- reads ----------------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.path(rel)))

    def read_bytes(self, rel: str) -> bytes:
        try:
            if self.is_local:
                # plain open/read: fsspec's cat_file adds an opener object and seeks per call,
                # which shows up when every chunk of every sample is read
                with open(self.path(rel), "rb") as f:
                    return f.read()
            return self.fs.cat_file(self.path(rel))
        except FileNotFoundError:
            raise StoreNotFoundError(f"{self.where(rel)}: missing") from None

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
        self._check_writable("create a directory")
        if self.is_local:
            os.makedirs(self.path(rel), exist_ok=True)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Plain write (inside a not-yet-committed shard)."""
        self._check_writable("write")
        if self.is_local:
            p = self.path(rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
        else:
            self.fs.pipe_file(self.path(rel), data)

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Replace ``rel`` so readers see the old or the new content, never a mix."""
        self._check_writable("write")
        if self.is_local:
            write_bytes(self.path(rel), data)
        else:
            self.fs.pipe_file(self.path(rel), data)  # one PUT: atomic on object stores

    def rename_dir(self, src: str, dst: str) -> None:
        self._check_writable("rename")
        if not self.is_local:
            raise StoreError("directory rename is only used on local stores")
        os.rename(self.path(src), self.path(dst))

    def remove_tree(self, rel: str) -> None:
        self._check_writable("delete")
        if self.fs.exists(self.path(rel)):
            self.fs.rm(self.path(rel), recursive=True)

    def remove_file(self, rel: str) -> None:
        self._check_writable("delete")
        try:
            self.fs.rm_file(self.path(rel))
        except FileNotFoundError:
            pass

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "protocol": self.fs.protocol, "local": self.is_local}

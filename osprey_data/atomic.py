"""Writing files and folders so that a reader sees the old version or the new one, never a mix.

Every writer of Osprey output (stores, corpora, drafters, checkpoints, exports, reports) goes
through here:

* a file is written to ``.<name>.tmp-<nonce>`` in the same directory, flushed and fsynced, then
  ``os.replace``-d over ``<name>`` (:func:`write_bytes`, :func:`write_text`, :func:`write_json`,
  or :func:`atomic_file` for libraries that write to a path themselves);
* a folder is filled under ``.<name>.tmp-<nonce>/`` and moved into place by :func:`replace_dir`
  (:func:`atomic_dir`). An existing folder is first renamed aside and removed only after the
  new one is in place, so a crash leaves either the old folder or the new one, never neither
  and never a half-deleted one (a leftover ``.<name>.old-<nonce>`` is the old version, intact).

Outputs get the permissions the user's umask gives, so a serving engine running as another
user can read an export: temporary files and folders are created like any other (``open``/
``mkdir``, not ``mkstemp``/``mkdtemp``, whose 0600/0700 modes would survive the rename), and
what libraries wrote with private modes of their own (safetensors creates 0600 files) is given
the umask's modes before it is moved into place.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from osprey_data.errors import ConfigError

__all__ = ["write_bytes", "write_text", "write_json", "atomic_file", "atomic_dir", "replace_dir",
           "temp_name", "apply_umask"]


def temp_name(path: str | os.PathLike, kind: str = "tmp") -> Path:
    """A fresh hidden sibling of ``path``: ``.<name>.<kind>-<nonce>`` in the same directory."""
    path = Path(path)
    return path.with_name(f".{path.name}.{kind}-{uuid.uuid4().hex[:12]}")


def _umask() -> int:
    """The process umask, read without changing it where /proc allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):  # pragma: no cover - not Linux
        pass
    mask = os.umask(0o022)  # pragma: no cover - set and restore
    os.umask(mask)  # pragma: no cover
    return mask  # pragma: no cover


def apply_umask(path: str | os.PathLike) -> None:
    """Give ``path`` (and, for a folder, everything in it) the modes a plain create would get.

    Files become ``0o666 & ~umask`` (``0o777`` if any execute bit was set), folders
    ``0o777 & ~umask``. Links are left alone.
    """
    mask = _umask()
    root = Path(path)
    paths = [root, *root.rglob("*")] if root.is_dir() and not root.is_symlink() else [root]
    for p in paths:
        if p.is_symlink():
            continue
        mode = os.stat(p).st_mode
        full = 0o777 if p.is_dir() or mode & 0o111 else 0o666
        os.chmod(p, full & ~mask)


def _fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        # O_EXCL: never write through a file someone else created; 0o666 & ~umask like open().
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # write()/fsync() errors (a full disk) carry no path of their own
        raise
    _fsync_dir(path.parent)
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, doc: Any, *, indent: int | None = 2, **dumps: Any) -> Path:
    """Replace ``path`` with ``doc`` as JSON (newline-terminated) atomically."""
    return write_text(path, json.dumps(doc, indent=indent, **dumps) + "\n")


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``, on error it is removed.

    For writers that take a file name (``matplotlib`` ``savefig``, ``safetensors`` ``save_file``).
    The name keeps ``path``'s suffix, so writers that choose a format by suffix still do.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    tmp = tmp.with_name(tmp.name + path.suffix)
    try:
        yield tmp
        _fsync_file(tmp)
        apply_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def replace_dir(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Move the complete folder ``src`` to ``dst`` (same filesystem), replacing a folder there.

    An existing ``dst`` is renamed aside first and deleted only once ``src`` is in place; if that
    second rename fails the old folder is put back. Never delete-then-rename. ``src``'s contents
    get the umask's modes first (:func:`apply_umask`).
    """
    src, dst = Path(src), Path(dst)
    apply_umask(src)
    old = None
    if dst.exists():
        old = temp_name(dst, "old")
        os.rename(dst, old)
    try:
        os.rename(src, dst)
    except BaseException:
        if old is not None:
            os.rename(old, dst)
        raise
    _fsync_dir(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return dst


@contextmanager
def atomic_dir(out: str | os.PathLike, *, overwrite: bool = False,
               exists_message: str | None = None) -> Iterator[Path]:
    """Yield a fresh temporary folder next to ``out``; on success it becomes ``out``.

    Args:
        out: the final folder.
        overwrite: replace an existing ``out`` (see :func:`replace_dir`); otherwise an existing
            ``out`` raises, before and after filling.
        exists_message: the error text for an existing ``out`` (a ``ConfigError``).

    On any error the temporary folder is removed and ``out`` is untouched.
    """
    out = Path(out)

    def refuse() -> None:
        if out.exists() and not overwrite:
            raise ConfigError(exists_message or f"{out} exists; pass --overwrite or choose another output")

    refuse()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(out)
    tmp.mkdir()
    try:
        yield tmp
        refuse()
        replace_dir(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

"""Where a build writes: resume an Osprey store, start a new one, never write into a stranger's folder.

:func:`check_output` runs before anything is loaded: ``--out`` may be missing (a new store), an
empty folder, or an Osprey store (resumed). A file, or a non-empty folder that is not a store, is
refused unless ``--overwrite``, which replaces it (:func:`replace_output`, called only once the
target has loaded, so a failed load never costs the old contents). fsspec URLs (``s3://``, ...)
are left to the store itself: an object-store prefix has no folder to inspect.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from osprey_data.atomic import temp_name
from osprey_data.errors import ConfigError

__all__ = ["check_output", "replace_output", "is_local_path", "STORE_ENTRIES"]

# What an Osprey store folder holds (manifest.json is written first, so a store without it is one
# whose very first writer died before the manifest; its other entries are still ours).
STORE_ENTRIES = frozenset({"manifest.json", "shards", "workers", "locks"})


def is_local_path(out: str) -> bool:
    return "://" not in out or out.startswith("file://")


def _local(out: str) -> Path:
    return Path(out[len("file://"):] if out.startswith("file://") else out).expanduser()


def _is_store(folder: Path) -> bool:
    names = {n for n in os.listdir(folder) if not n.startswith(".")}
    return "manifest.json" in names or (bool(names) and names <= STORE_ENTRIES)


def check_output(out: str, *, overwrite: bool) -> str:
    """Classify ``out``: ``"new"``, ``"store"`` (resume) or ``"replace"`` (``overwrite`` given).

    Raises:
        ConfigError: ``out`` is a file or a non-empty non-store folder and ``overwrite`` is off;
            ``overwrite`` with an fsspec URL.
    """
    if not is_local_path(out):
        if overwrite:
            raise ConfigError(f"--overwrite replaces local folders only; delete {out} with your storage's tools")
        return "store"
    path = _local(out)
    if not path.exists() and not path.is_symlink():
        return "new"
    if overwrite:
        return "replace"
    if not path.is_dir():
        raise ConfigError(f"--out {out} is a file, not a store folder; choose another --out "
                          f"(or pass --overwrite to replace it)")
    if not any(True for _ in os.scandir(path)):
        return "new"
    if _is_store(path):
        return "store"
    raise ConfigError(f"--out {out} is a non-empty folder that is not an Osprey store (no manifest.json); "
                      f"choose a new folder, or pass --overwrite to replace it and everything in it")


def replace_output(out: str) -> None:
    """Remove ``out`` (moved aside first, so a crash leaves it whole or gone, never half-deleted)."""
    path = _local(out)
    if path.is_dir() and not path.is_symlink():
        aside = temp_name(path, "old")
        os.rename(path, aside)
        shutil.rmtree(aside)
    elif path.exists() or path.is_symlink():
        path.unlink()

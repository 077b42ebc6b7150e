"""Locks that let several ``osprey study run`` processes share one study folder.

A study on a small machine is mostly stages that use one or two cores each (a distillation keeps
~1.4 of 2 cores busy); a second runner on the same folder picks up whatever stage is ready and
nobody else holds, so independent stages run side by side. What makes that safe:

* ``OUT/locks/runner-PID-RANDOM``: each runner holds an exclusive ``flock`` on its own file while it
  works; a file nobody holds is a runner that died (ignored, removed by the next runner that joins).
* ``OUT/locks/KIND-KEY``: the runner of a stage holds it for the whole stage, so a stage's work
  folder only ever has one writer. A runner that cannot take it moves on to another stage.
* ``OUT/.lock``: held exclusively for the instant a runner joins, so that two runners never join
  with different study files (the folder's ``study.toml`` is the one ``status`` and ``report`` read).

``OUT/locks`` must be a plain folder and every lock a plain file: a symlink there is refused, never
followed (it would create or lock files elsewhere), as the store's ``locks/`` and ``.osprey.lock``.

``flock`` locks are released by the kernel when their process dies, so a killed runner never
leaves a stage or the folder locked.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from osprey_data.errors import ConfigError, StudyBusyError

__all__ = ["join_study", "live_runners", "claim_stage", "StageClaim"]

_RUNNER_PREFIX = "runner-"


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _locks(out: Path) -> Path:
    """``OUT/locks``, a plain folder: a symlink planted there would create the locks elsewhere."""
    folder = out / "locks"
    if not folder.is_symlink():
        folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink() or not folder.is_dir():
        raise ConfigError(f"{folder}: must be a plain folder of the study, not a symlink or a file (the runner "
                          f"creates its stage locks there); remove it (`rm {folder}`) and run again")
    return folder


def _open_lock(path: Path, flags: int, mode: str) -> IO[str]:
    """Open a lock file without following a symlink (a planted link is refused, naming it)."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, 0o666)
    except OSError:
        if path.is_symlink():
            raise ConfigError(f"{path}: a study lock must be a plain file, not a symlink; remove it and run "
                              "again") from None
        raise
    return os.fdopen(fd, mode, encoding="utf-8")


def _held_by_someone(path: Path) -> str | None:
    """The holder line of a runner file whose lock is held (by any process, this one included)."""
    try:
        fh = _open_lock(path, os.O_RDONLY, "r")
    except (FileNotFoundError, ConfigError):   # gone, or a planted link: no runner holds it
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return fh.read().strip() or path.name
        fcntl.flock(fh, fcntl.LOCK_UN)
        return None


def live_runners(out: Path, *, exclude: str | None = None) -> list[str]:
    """'pid N since T' of every runner working in ``out`` now, but the one registered as ``exclude``
    (the name :func:`join_study` yields)."""
    folder = Path(out) / "locks"
    if folder.is_symlink() or not folder.is_dir():
        return []
    live = []
    for path in sorted(folder.glob(f"{_RUNNER_PREFIX}*")):
        if path.name == exclude:
            continue
        holder = _held_by_someone(path)
        if holder is not None:
            live.append(holder)
    return live


@contextmanager
def join_study(out: Path, study_text: str | None) -> Iterator[str]:
    """Register a runner of ``out`` (writing ``study.toml`` from ``study_text``) and yield its name;
    StudyBusyError when a live runner works there on another study file."""
    out.mkdir(parents=True, exist_ok=True)
    locks = _locks(out)
    # pid plus a random part: a pid is reused, and one process may hold two registrations (tests)
    mine_path = locks / f"{_RUNNER_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    with _open_lock(out / ".lock", os.O_RDWR | os.O_CREAT | os.O_APPEND, "a+") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)   # held for the instant of joining only
        live = []
        for path in sorted(locks.glob(f"{_RUNNER_PREFIX}*")):   # one look per file: live, or stale and removed
            holder = _held_by_someone(path)
            if holder is None:
                path.unlink(missing_ok=True)
            else:
                live.append(holder)
        current = out / "study.toml"
        if live and study_text is not None and current.is_file() and current.read_text(encoding="utf-8") != study_text:
            raise StudyBusyError(f"{out}: another `osprey study run` ({live[0]}) is working in this folder on a "
                                 "different study file; wait for it or stop it first (it resumes where it "
                                 "stopped), or give this study its own --out")
        if study_text is not None and not (live and current.is_file()):
            current.write_text(study_text, encoding="utf-8")
        mine = _open_lock(mine_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "w")
        fcntl.flock(mine, fcntl.LOCK_EX)
        mine.write(f"pid {os.getpid()} since {datetime.now(timezone.utc).isoformat(timespec='seconds')}\n")
        mine.flush()
    try:
        yield mine_path.name
    finally:
        mine_path.unlink(missing_ok=True)
        mine.close()


class StageClaim:
    """This runner's exclusive hold on one stage (release it with :meth:`release`)."""

    def __init__(self, fh: IO[str]) -> None:
        self._fh = fh

    def release(self) -> None:
        if not self._fh.closed:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()


def claim_stage(out: Path, folder: str) -> StageClaim | None:
    """Take the stage ``folder`` (KIND-KEY) for this runner, or None when another runner holds it."""
    fh = _open_lock(_locks(out) / folder, os.O_RDWR | os.O_CREAT | os.O_APPEND, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    return StageClaim(fh)

"""Checksums of finished study stages, checked before a stage's output is used again.

A finished stage is reused for as long as its folder exists: a later ``study run`` feeds it to the
stages that depend on it. One flipped exponent bit in a converted drafter's ``model.safetensors``
would then be distilled from silently (a weight of 1e36 in the final drafter). So when a stage
finishes, the runner records the sha256 of every file of its output in ``stage.json``
(``outputs_sha256``, relative path -> hex digest), and before a finished stage is given to another
stage as an input, :func:`verify_stage` checks them.

A mismatch is refused, not repaired: :class:`~osprey_data.errors.StageCorruptError` names the
stage, the file and the way out (delete that stage's folder and rerun the command: the stage
is rerun from its own inputs, deterministically). Rerunning it silently would hide a failing
disk and could replace a file the user edited on purpose.

Not hashed: ``stage.json`` itself, run-lock files (rewritten by every run), and outputs that verify
themselves on every read: a feature store (``store/``: per-shard commit checksums) and a
tokenized corpus (``corpus/``: per-shard sha256 in its ``index.json``). Stages finished before
checksums existed have none and are reused as before.

A finished stage that nothing reads again (the final distilled drafter, the one people export) is
checked by ``osprey study status --verify`` and by every ``osprey study report``
(:func:`damaged_outputs`, :func:`refuse_damaged`): the report refuses to present the figures of a
study whose finished stages no longer match their records.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from osprey_data import jsonio
from osprey_data.digest import file_sha256
from osprey_data.errors import SchemaError, StageCorruptError
from osprey_data.schema_check import validate
from osprey_train.trainer.run_lock import LOCK_NAME

__all__ = ["output_checksums", "verify_stage", "read_stage_record", "damaged_outputs", "refuse_damaged",
           "CHECKSUM_KEY", "STAGE_SCHEMA"]

CHECKSUM_KEY = "outputs_sha256"
STAGE_RECORD = "stage.json"
STAGE_SCHEMA = "study-stage.v1.json"
# kind -> sub-folder that checks its own integrity on every read (not hashed again here)
_SELF_VERIFYING = {"store": "store", "corpus": "corpus"}
_SKIPPED_NAMES = {STAGE_RECORD, LOCK_NAME}


def _files(folder: Path, kind: str) -> list[str]:
    skip = _SELF_VERIFYING.get(kind)
    out = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.is_file() or path.name in _SKIPPED_NAMES:
            continue
        rel = path.relative_to(folder).as_posix()
        if skip is not None and (rel == skip or rel.startswith(skip + "/")):
            continue
        out.append(rel)
    return out


def output_checksums(folder: Path, kind: str) -> dict[str, str]:
    """sha256 of every file of the stage output in ``folder`` (see the module docstring)."""
    folder = Path(folder)
    return {rel: file_sha256(folder / rel) for rel in _files(folder, kind)}


def read_stage_record(folder: Path) -> dict[str, Any]:
    """The parsed ``stage.json`` of a finished stage; StageCorruptError when it is not readable JSON."""
    path = Path(folder) / STAGE_RECORD
    try:
        doc = jsonio.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StageCorruptError(f"{path}: finished stage record unreadable ({type(exc).__name__}); delete "
                                f"{Path(folder)} and rerun the same command to run that stage again") from None
    if not isinstance(doc, dict) or doc.get("format") != "osprey-study-stage":
        raise StageCorruptError(f"{path}: not a study stage record; delete {Path(folder)} and rerun the same "
                                "command to run that stage again")
    try:
        validate(doc, STAGE_SCHEMA, where=str(path))
    except SchemaError as exc:
        raise StageCorruptError(f"{exc}; delete {Path(folder)} and rerun the same command to run that stage "
                                "again") from None
    return doc


def verify_stage(folder: Path, label: str) -> dict[str, Any]:
    """Check a finished stage's files against the checksums its record keeps; returns the record.

    Raises:
        StageCorruptError: the record is unreadable, or a recorded file is missing or changed.
    """
    folder = Path(folder)
    record = read_stage_record(folder)
    sums = record.get(CHECKSUM_KEY)
    if sums is None:
        return record
    if not isinstance(sums, dict):
        raise StageCorruptError(f"{folder / STAGE_RECORD}: {CHECKSUM_KEY} is not a mapping; delete {folder} "
                                "and rerun the same command to run that stage again")
    root = folder.resolve()
    for rel, digest in sums.items():
        path = (folder / str(rel)).resolve()
        if not path.is_relative_to(root):
            raise StageCorruptError(f"{folder / STAGE_RECORD}: names {rel!r} outside the stage folder; delete "
                                    f"{folder} and rerun the same command")
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise StageCorruptError(f"{folder / rel}: output of finished stage {label} is unreadable "
                                    f"({exc.strerror}); delete {folder} and rerun the same command to run "
                                    "that stage again") from None
        if actual != digest:
            raise StageCorruptError(f"{folder / rel}: output of finished stage {label} is damaged (sha256 differs "
                                    f"from the one recorded when it finished); delete {folder} and rerun the same "
                                    "command to run that stage again")
    return record


def damaged_outputs(stages: Iterable[tuple[Path, str]]) -> list[dict[str, str]]:
    """Every finished stage of ``stages`` (folder, label) whose outputs differ from its record:
    ``{"stage", "folder", "problem"}`` each (an empty list: all sound)."""
    found = []
    for folder, label in stages:
        try:
            verify_stage(folder, label)
        except StageCorruptError as exc:
            found.append({"stage": label, "folder": str(folder), "problem": str(exc)})
    return found


def refuse_damaged(stages: Iterable[tuple[Path, str]], what: str) -> None:
    """Raise :class:`StageCorruptError` naming each damaged finished stage of ``stages`` and the way
    out, so that ``what`` (a report) never presents their figures as sound."""
    found = damaged_outputs(stages)
    if found:
        names = "; ".join(f"{d['stage']} ({d['problem']})" for d in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise StageCorruptError(
            f"{what}: {len(found)} finished stage(s) no longer match the sha256 recorded when they finished, so "
            f"their figures are not presented: {names}{more}. Delete each named stage folder and rerun "
            f"`osprey study run` (the stages are rerun from their inputs), then report again")

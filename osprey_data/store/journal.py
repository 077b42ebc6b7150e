"""Reading and writing a store's bookkeeping files: worker journals and ``manifest.json``.

Each writer owns exactly one journal, ``workers/<worker>.json`` (schema
``store-worker-journal.v1.json``), that it atomically replaces after every committed shard; no
journal or shard is ever written by two processes. Publishing (:func:`publish`) — rewriting
``manifest.json`` as the union of every journal's shards — happens only in one place: by the
single writer itself when ``num_workers == 1``, or by an explicit ``merge_store``
(:mod:`osprey_data.store.merge`, ``osprey data merge``) after (or even while) several workers
write. It is idempotent: it recomputes the whole list each time.

``manifest.json`` is the one file several processes may replace (two merges, a merge and a
single writer), so :func:`publish` is a compare-and-swap loop: read the manifest with a version
token (S3 ETag, or a content hash under a lock locally), compute the union of every journal
AND the shards already visible, write only if the manifest is still that version, otherwise
start over. The visible shard set therefore only grows: a merge that read the store before
another merge published cannot overwrite it with an older list (no lost shard, no rename, no
lock service; see ``fs.py`` for how each storage checks the version).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from typing import Any


from osprey_data import jsonio
from osprey_data.errors import (FormatVersionError, ManifestMismatchError, SchemaError, StoreCorruptError,
                                StoreError, StoreNotFoundError)
from osprey_data.schema_check import validate
from osprey_data.store.fs import StoreFS
from osprey_data.store.manifest import (
    FORMAT_VERSION, Manifest, ShardInfo, StoreHeader, header_hash, parse_manifest,
)
from osprey_data.store.shard import COMMIT_FILE, TABLE_FILE, info_from_commit, parse_commit, read_table_bytes

__all__ = ["MANIFEST_FILE", "read_manifest", "read_journal", "write_journal", "publish", "journal_path",
           "shard_sample_ids"]

MANIFEST_FILE = "manifest.json"

# Compare-and-swap attempts of one publish before giving up (each loser of a race retries
# after a random, growing pause; dozens of merges at once still settle well within this).
PUBLISH_ATTEMPTS = 40


def journal_path(worker: str) -> str:
    return f"workers/{worker}.json"


def read_manifest(fs: StoreFS) -> Manifest:
    """The store's manifest, or StoreNotFoundError saying what to do."""
    fs.check_root()
    if not fs.exists(MANIFEST_FILE):
        hint = (" Worker journals exist: run `osprey data merge` to publish their shards."
                if fs.listdir("workers") else "")
        raise StoreNotFoundError(f"{fs.where(MANIFEST_FILE)}: no manifest.json — not an Osprey store "
                                 f"(or it was never created).{hint}")
    return parse_manifest(fs.read_bytes(MANIFEST_FILE), where=fs.where(MANIFEST_FILE))


def read_journal(fs: StoreFS, name: str) -> dict[str, Any]:
    rel = f"workers/{name}"
    try:
        doc = jsonio.loads(fs.read_bytes(rel))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreCorruptError(f"{fs.where(rel)}: worker journal is not valid JSON ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("format_version"), int) and doc["format_version"] > FORMAT_VERSION:
        raise FormatVersionError(f"{fs.where(rel)}: journal format_version {doc['format_version']} is newer "
                                 f"than supported ({FORMAT_VERSION}); upgrade Osprey")
    try:
        validate(doc, "store-worker-journal.v1.json", where=fs.where(rel))
    except SchemaError as exc:
        raise StoreCorruptError(str(exc)) from None
    return doc


def write_journal(fs: StoreFS, *, worker: str, worker_index: int, num_workers: int,
                  header: StoreHeader, shards: list[ShardInfo], skips: dict[str, Any]) -> None:
    """Replace ``workers/<worker>.json``; ``skips`` is a :meth:`SkipLog.to_doc`."""
    doc = {
        "format_version": FORMAT_VERSION, "worker": worker, "worker_index": worker_index,
        "num_workers": num_workers, "header_sha256": header_hash(header),
        "shards": [s.to_dict() for s in shards], **skips,
    }
    # one line per shard and per entry; the runs of a (file, code) on one line (no indent): their
    # count is unbounded, and an indented run costs four lines
    skipped = doc.pop("skipped")
    text = json.dumps(doc, indent=1)
    runs = ",\n  ".join(json.dumps(item, separators=(",", ":")) for item in skipped)
    text = text[:-2] + (',\n "skipped": [\n  ' + runs + "\n ]\n}" if skipped else ',\n "skipped": []\n}')
    fs.write_atomic(journal_path(worker), text.encode())


def shard_sample_ids(fs: StoreFS, shard_id: str) -> list[str]:
    """The sample ids of a committed shard, in row order (from its Parquet table)."""
    rel = f"shards/{shard_id}/{TABLE_FILE}"
    try:
        return read_table_bytes(fs.read_bytes(rel), columns=["sample_id"]).column(0).to_pylist()
    except StoreNotFoundError:
        raise StoreCorruptError(f"{fs.where(rel)}: missing for a committed shard") from None
    except Exception as exc:  # damaged parquet
        raise StoreCorruptError(f"{fs.where(rel)}: unreadable ({exc})") from None


def entry_problem(fs: StoreFS, info: ShardInfo, want_header: str) -> str | None:
    """Why a journal entry must not be published (None when it matches its shard's commit record).

    Readers trust manifest.json's ``commit_sha256`` for every shard, so an entry that disagrees
    with the ``_COMMIT.json`` actually there would make that shard unreadable for every consumer;
    it is refused here instead, before it becomes visible (and unremovable: visible shards stay)."""
    rel = f"shards/{info.shard_id}/{COMMIT_FILE}"
    try:
        raw = fs.read_bytes(rel)
    except StoreNotFoundError:
        return f"its {COMMIT_FILE} is missing"
    if hashlib.sha256(raw).hexdigest() != info.commit_sha256:
        return f"its {COMMIT_FILE} has another sha256 than the journal entry says ({info.commit_sha256[:12]}…)"
    try:
        doc = parse_commit(raw, where=fs.where(rel))
    except StoreCorruptError as exc:
        return str(exc)
    if doc["header_sha256"] != want_header:
        return f"its {COMMIT_FILE} was written for another header"
    if info_from_commit(raw, doc) != info:
        return f"the journal entry's counts or sizes differ from its {COMMIT_FILE}"
    return None


def _union(fs: StoreFS, header: StoreHeader, visible: list[ShardInfo], *, check_duplicates: bool,
           sample_ids: dict[tuple[str, str], list[str]],
           checked: dict[ShardInfo, str | None], refused: list[str]) -> Manifest:
    """The manifest listing every journal's shards; the ``visible`` ones must all be among them.

    Entries not yet visible are verified against their shard's commit record first (``checked``
    caches the verdicts across compare-and-swap attempts); a bad one is left out and described
    in ``refused``, the others are published."""
    want = header_hash(header)
    already = set(visible)
    shards: dict[str, ShardInfo] = {}
    num_errors = 0
    for name in fs.listdir("workers"):
        if not name.endswith(".json"):
            continue  # temp files of an in-progress atomic replace
        doc = read_journal(fs, name)
        if doc["header_sha256"] != want:
            raise ManifestMismatchError(
                f"{fs.where('workers/' + name)}: worker {doc['worker']} wrote shards for a different "
                "target/config (header hash differs from manifest.json); remove it or build into "
                "another store")
        num_errors += doc.get("num_errors", len(doc["errors"]))   # older journals list every one
        for s in doc["shards"]:
            info = ShardInfo.from_dict(s)
            if info not in already:
                if info not in checked:
                    checked[info] = entry_problem(fs, info, want)
                if checked[info] is not None:
                    refused.append(f"worker {doc['worker']} shard {info.shard_id}: {checked[info]}")
                    continue
            if info.shard_id in shards and shards[info.shard_id] != info:
                raise StoreCorruptError(f"shard {info.shard_id} is claimed by two journals with different content")
            shards[info.shard_id] = info
    for info in visible:  # shards visible before must stay visible, unchanged
        if shards.get(info.shard_id) != info:
            why = "lists it differently" if info.shard_id in shards else "does not list it (journal missing or rewritten)"
            raise StoreCorruptError(f"{fs.where(MANIFEST_FILE)}: lists shard {info.shard_id} but the journal of "
                                    f"worker {info.worker} {why}; restore workers/{info.worker}.json")
    ordered = [shards[k] for k in sorted(shards)]
    if check_duplicates:
        seen: dict[str, str] = {}
        for info in ordered:
            key = (info.shard_id, info.commit_sha256)
            if key not in sample_ids:
                sample_ids[key] = shard_sample_ids(fs, info.shard_id)
            for sid in sample_ids[key]:
                if sid in seen:
                    raise StoreCorruptError(
                        f"sample {sid!r} is in both shard {seen[sid]} and shard {info.shard_id}; "
                        "two workers processed the same sample — delete one of the shards' journal "
                        "entries or rebuild one worker")
                seen[sid] = info.shard_id
    return Manifest(header=header, shards=ordered, num_errors=num_errors)


def publish(fs: StoreFS, header: StoreHeader, *, check_duplicates: bool) -> Manifest:
    """Rewrite manifest.json as the union of all worker journals, by compare-and-swap.

    Creates the manifest when absent. Retries (re-reading everything) when another process
    replaced the manifest between our read and our write; never drops a visible shard.
    """
    sample_ids: dict[tuple[str, str], list[str]] = {}  # reused across attempts
    checked: dict[ShardInfo, str | None] = {}
    for attempt in range(PUBLISH_ATTEMPTS):
        refused: list[str] = []
        current = fs.read_for_update(MANIFEST_FILE)
        visible: list[ShardInfo] = []
        if current.data is not None:
            old = parse_manifest(current.data, where=fs.where(MANIFEST_FILE))
            if old.header != header:
                raise ManifestMismatchError(f"{fs.where(MANIFEST_FILE)}: the store's header differs from the "
                                            "one being published (another build config wrote it)")
            visible = old.shards
        manifest = _union(fs, header, visible, check_duplicates=check_duplicates, sample_ids=sample_ids,
                          checked=checked, refused=refused)
        data = json.dumps(manifest.to_dict(), indent=1).encode()
        if fs.replace_if_unchanged(MANIFEST_FILE, data, current.token):
            if refused:
                raise StoreCorruptError(
                    f"{fs.where(MANIFEST_FILE)}: published {len(manifest.shards)} shard(s) but refused "
                    f"{len(refused)} journal entr{'y' if len(refused) == 1 else 'ies'} — "
                    + "; ".join(refused[:5]) + ("; …" if len(refused) > 5 else "")
                    + ". Restore that worker's journal (workers/<worker>.json) or rebuild the worker, "
                    "then merge again")
            return manifest
        time.sleep(random.uniform(0.0, min(2.0, 0.01 * 2 ** attempt)))
    raise StoreError(f"{fs.where(MANIFEST_FILE)}: changed by other processes {PUBLISH_ATTEMPTS} times while "
                     "this merge was computing its update; nothing was lost — run the merge again")

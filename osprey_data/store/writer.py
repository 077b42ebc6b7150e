"""StoreWriter: append samples to a store from one worker, crash-safe and resumable.

Life of a shard (``<worker>-<seq>``, e.g. ``w000of002-000003``, so concurrent workers never
collide):

1. A background thread takes records from a bounded queue (``add`` blocks when it is full, so
   memory stays bounded while encoding/compression/IO overlap the caller's compute) and streams
   them into a shard directory: ``shards/.tmp-<shard>-<nonce>/`` on local disk, the final
   ``shards/<shard>/`` on object stores.
2. When the shard reaches ``shard_max_tokens`` (or on ``close``) its table, Zarr metadata and
   finally ``_COMMIT.json`` are written; locally the temp dir is then renamed into place.
3. The worker's journal ``workers/<worker>.json`` is atomically replaced to list the shard.
4. With ``num_workers == 1`` the manifest is republished; otherwise ``merge_store`` does it.

A crash between any two steps is repaired when the same worker reopens the store: temp dirs
are deleted, a committed-but-unjournaled shard is adopted (its _COMMIT.json proves it complete,
once every file it lists is found with its size), an uncommitted or incomplete shard is deleted.
``done_sample_ids`` then lists exactly the samples in journaled shards, so the builder resumes
with nothing lost or doubled.

Only one live process may write as a given worker (:mod:`.worker_lock`): recovery deletes that
worker's unfinished shards, which would be another live writer's work. A commit checks that
every file of the shard is in place before the shard is journaled.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import re
import threading
import uuid

from osprey_data.errors import ConfigError, InputError, ManifestMismatchError, StoreError
from osprey_data.store.fs import StoreFS
from osprey_data.store.manifest import Manifest, ShardInfo, StoreHeader, header_differences, header_hash
from osprey_data.store.journal import (
    MANIFEST_FILE, publish, read_journal, read_manifest, shard_sample_ids, write_journal,
)
from osprey_data.store.records import SampleRecord, check_record
from osprey_data.store.shard import COMMIT_FILE, ShardBuilder, info_from_commit, missing_files, parse_commit
from osprey_data.store.skip_log import SkipLog
from osprey_data.store.worker_lock import WorkerLock

__all__ = ["StoreWriter", "QUEUE_RECORDS"]

# Records waiting for the background thread; bounds memory to a few samples' hidden states.
QUEUE_RECORDS = 8
_CLOSE, _ABORT = object(), object()


def worker_name(worker_index: int, num_workers: int) -> str:
    return f"w{worker_index:03d}of{num_workers:03d}"


class StoreWriter:
    """Write samples into the store at ``url`` as worker ``worker_index`` of ``num_workers``."""

    def __init__(self, url: str, header: StoreHeader, *, worker_index: int = 0, num_workers: int = 1,
                 shard_max_tokens: int = 65536, storage_options: dict | None = None) -> None:
        if num_workers < 1 or not 0 <= worker_index < num_workers:
            raise ConfigError(f"worker_index {worker_index} must be in [0, num_workers={num_workers})")
        if shard_max_tokens < 1:
            raise ConfigError(f"shard_max_tokens must be >= 1, got {shard_max_tokens}")
        self.url, self.header = url, header
        self.worker_index, self.num_workers = worker_index, num_workers
        self.shard_max_tokens = shard_max_tokens
        self.worker = worker_name(worker_index, num_workers)
        self.fs = StoreFS(url, storage_options=storage_options, read_only=False)
        self.fs.check_writable()  # read-only credentials fail here, naming the store, not at the first commit
        self._lock = threading.Lock()
        self._skips = SkipLog()
        self._shards: list[ShardInfo] = []
        self._done: set[str] = set()
        self._pending_ids: set[str] = set()
        self.worker_lock = WorkerLock(self.fs, self.worker)
        self.worker_lock.acquire()  # before recovery, which deletes this worker's unfinished shards
        try:
            self._open_or_create()
            self._recover()
        except BaseException:
            self.worker_lock.release()
            raise
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_RECORDS)
        self._bg_error: BaseException | None = None
        self._builder: ShardBuilder | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"osprey-store-{self.worker}", daemon=True)
        self._thread.start()

    # --- opening and recovery ---------------------------------------------------------------

    def _open_or_create(self) -> None:
        if self.fs.exists(MANIFEST_FILE):
            existing = read_manifest(self.fs).header
            if existing != self.header:
                diffs = header_differences(existing, self.header)
                raise ManifestMismatchError(
                    f"{self.fs.where(MANIFEST_FILE)}: store was created with a different header; "
                    f"differing field(s): {'; '.join(diffs)}. Use another store or the same build config.")
        else:
            self.fs.makedirs("shards")
            empty = json.dumps(Manifest(header=self.header).to_dict(), indent=1).encode()
            if not self.fs.replace_if_unchanged(MANIFEST_FILE, empty, None):
                self._open_or_create()  # another worker created it first: check its header

    def _recover(self) -> None:
        journal_file = f"{self.worker}.json"
        if journal_file in self.fs.listdir("workers"):
            doc = read_journal(self.fs, journal_file)
            if doc["header_sha256"] != header_hash(self.header):
                raise ManifestMismatchError(f"{self.fs.where('workers/' + journal_file)}: journal was "
                                            "written for a different header")
            self._shards = [ShardInfo.from_dict(s) for s in doc["shards"]]
            self._skips = SkipLog.from_doc(doc, where=self.fs.where("workers/" + journal_file))
        journaled = {s.shard_id for s in self._shards}
        changed = False
        for name in self.fs.listdir("shards"):
            if name.startswith(f".tmp-{self.worker}-"):
                self.fs.remove_tree(f"shards/{name}")  # a crashed writer's unfinished shard
            elif name.startswith(f"{self.worker}-") and name not in journaled:
                rel = f"shards/{name}/{COMMIT_FILE}"
                if self.fs.exists(rel):  # committed, crash before the journal update: adopt
                    raw = self.fs.read_bytes(rel)
                    doc = parse_commit(raw, where=self.fs.where(rel))
                    if doc["header_sha256"] != header_hash(self.header):
                        raise ManifestMismatchError(f"{self.fs.where('shards/' + name)}: shard of a different header")
                    if not missing_files(self.fs, f"shards/{name}", doc):
                        self._shards.append(info_from_commit(raw, doc))
                        changed = True
                        continue
                # never journaled and incomplete (files written in place on an object store but
                # never committed, or a commit whose files are gone): its samples are redone
                self.fs.remove_tree(f"shards/{name}")
        self._shards.sort(key=lambda s: s.shard_id)
        for info in self._shards:
            self._done.update(shard_sample_ids(self.fs, info.shard_id))
        seqs = [int(m.group(1)) for s in self._shards if (m := re.search(r"-(\d+)$", s.shard_id))]
        self._next_seq = max(seqs, default=-1) + 1
        if changed or not self.fs.exists(f"workers/{self.worker}.json"):
            self._write_journal()
            if changed and self.num_workers == 1:
                publish(self.fs, self.header, check_duplicates=False)

    def _write_journal(self) -> None:
        with self._lock:
            shards = list(self._shards)
            skips = self._skips.to_doc()   # fresh lists: the builder may record more meanwhile
        write_journal(self.fs, worker=self.worker, worker_index=self.worker_index,
                      num_workers=self.num_workers, header=self.header, shards=shards, skips=skips)

    # --- public API -----------------------------------------------------------------------

    def done_sample_ids(self) -> set[str]:
        """Sample ids already committed by this worker (skip them when resuming)."""
        with self._lock:
            return set(self._done)

    def committed_shards(self) -> list[ShardInfo]:
        """The shards this worker has committed (and journaled) so far, with their sizes."""
        with self._lock:
            return list(self._shards)

    def recorded_errors(self) -> list[dict]:
        """The full entries of the skipped records kept so far (a bounded sample per reason code,
        :mod:`osprey_data.store.skip_log`), including those a resumed worker's journal held."""
        with self._lock:
            return self._skips.messages()

    def num_errors(self) -> int:
        """Skipped records recorded so far (this run and the journal it resumed)."""
        with self._lock:
            return len(self._skips)

    def is_skipped(self, file: str | None, line: int | None, codes: tuple[str, ...] | None = None) -> bool:
        """Whether the input record at ``file:line`` is already recorded as skipped (for one of
        ``codes``, or any): resume."""
        with self._lock:
            return self._skips.holds(file, line, codes)

    def add(self, record: SampleRecord) -> None:
        """Queue one sample; blocks while the background writer is ``QUEUE_RECORDS`` behind."""
        self._raise_bg_error()
        if self._closed:
            raise StoreError("StoreWriter.add after close()")
        h = self.header
        check_record(record, num_taps=h.num_taps, hidden_size=h.target.hidden_size, topk=h.topk,
                     vocab_size=h.target.vocab_size, has_final_hidden=h.has_final_hidden)
        with self._lock:
            if record.sample_id in self._done or record.sample_id in self._pending_ids:
                raise InputError(f"sample {record.sample_id!r} was already added to this store by "
                                 f"worker {self.worker}; skip ids in done_sample_ids()")
            self._pending_ids.add(record.sample_id)
        record = _to_host(record)
        self._queue.put(record)

    def record_error(self, *, sample_id: str | None, file: str | None, line: int | None, reason: str) -> bool:
        """Remember a sample that could not be built; saved in the worker journal (compactly:
        :mod:`osprey_data.store.skip_log`). False when its ``file:line`` was already recorded."""
        with self._lock:
            return self._skips.add(sample_id=sample_id, file=file, line=line, reason=reason)

    def close(self) -> None:
        """Commit the last shard, save the journal and (single worker) publish the manifest."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_CLOSE)
        self._thread.join()
        try:
            self._raise_bg_error()
            self._write_journal()
            if self.num_workers == 1:
                publish(self.fs, self.header, check_duplicates=False)
        finally:
            self.worker_lock.release()

    def abort(self) -> None:
        """Stop without committing the open shard (already committed shards stay)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_ABORT)
        self._thread.join()
        try:
            self._write_journal()
        finally:
            self.worker_lock.release()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # --- background thread ------------------------------------------------------------------

    def _raise_bg_error(self) -> None:
        if self._bg_error is not None:
            err = self._bg_error
            raise StoreError(f"background shard writer of {self.worker} failed: {err}") from err

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE or item is _ABORT:
                if self._bg_error is None:
                    try:
                        if item is _CLOSE and self._builder is not None:
                            self._commit()
                        elif self._builder is not None:
                            self._discard()
                    except BaseException as exc:  # reported by close()
                        self._bg_error = exc
                        self._discard_quietly()
                return
            if self._bg_error is not None:
                continue  # keep draining so add() never blocks forever
            try:
                if self._builder is None:
                    self._start_shard()
                self._builder.add(item)
                if self._builder.num_tokens >= self.shard_max_tokens:
                    self._commit()
            except BaseException as exc:
                self._bg_error = exc
                self._discard_quietly()

    def _start_shard(self) -> None:
        shard_id = f"{self.worker}-{self._next_seq:06d}"
        self._next_seq += 1
        rel = (f"shards/.tmp-{shard_id}-{uuid.uuid4().hex[:8]}" if self.fs.is_local
               else f"shards/{shard_id}")
        self._builder = ShardBuilder(self.fs, self.header, shard_id=shard_id, worker=self.worker, rel_dir=rel)

    def _discard_quietly(self) -> None:
        """After a failure: remove the unfinished shard (its own error is the one reported)."""
        try:
            self._discard()
        except Exception:
            pass

    def _discard(self) -> None:
        if self._builder is not None:
            self.fs.remove_tree(self._builder.rel_dir)
            with self._lock:
                self._pending_ids -= {r["sample_id"] for r in self._builder.rows}
            self._builder = None

    def _commit(self) -> None:
        b = self._builder
        assert b is not None
        raw, info = b.finish()
        final = f"shards/{b.shard_id}"
        if b.rel_dir != final:
            self.fs.rename_dir(b.rel_dir, final)
        # the shard is journaled (and published) only with every file in place, as recorded
        problems = missing_files(self.fs, final, parse_commit(raw, where=self.fs.where(final)))
        if self.fs.read_bytes(f"{final}/{COMMIT_FILE}") != raw:
            problems.append(f"{COMMIT_FILE} differs from the one written")
        if problems:
            raise StoreError(f"{self.fs.where(final)}: shard not committed, its files changed under the writer "
                             f"({'; '.join(problems)}); is another process writing as worker {self.worker}?")
        ids = {r["sample_id"] for r in b.rows}
        with self._lock:
            self._shards.append(info)
            self._done |= ids
            self._pending_ids -= ids
        self._builder = None
        self._write_journal()
        if self.num_workers == 1:
            publish(self.fs, self.header, check_duplicates=False)


def _to_host(rec: SampleRecord) -> SampleRecord:
    """Move torch tensors off accelerators now, so the caller may free device memory."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return rec
    changes = {}
    for name in ("hidden_TLD", "final_hidden_TD"):
        v = getattr(rec, name)
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            changes[name] = v.detach().to("cpu")
    return dataclasses.replace(rec, **changes) if changes else rec

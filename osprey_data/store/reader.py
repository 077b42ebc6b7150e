"""StoreReader: strictly read-only, random-access reads of a published store.

Only shards listed in ``manifest.json`` exist for a reader (temp dirs, unmerged shards of
running workers and anything else in the folder are invisible). Sample ``i`` is located by a
binary search over the manifest's per-shard sample counts, so one sample costs reading one
shard's small Parquet table (cached) plus the few chunks holding its rows — never a scan.
Every byte is checked against the shard's ``_COMMIT.json`` CRCs; nothing is ever unpickled.
Remote stores (``s3://`` ...) are read through a local cache of committed shard files with
background prefetch of the shards being read and the next one (``cache.py``).

A reader checks what it relies on, not only what ``osprey data validate`` would: the manifest
lists every shard once, each shard's table rows tile its token arrays in order (checked when the
table is first read), and — unless ``check_values=False`` — every sample handed out has finite
hidden states and log-probs (a bit test on the stored bf16 values, ~5% of a sample's read time),
so NaN from a damaged store stops training or evaluation naming the sample.

Dtype policy: numpy outputs float32 hidden states (numpy has no bfloat16; decoding is exact);
``as_torch=True`` gives bfloat16 hidden tensors (what the store holds) and int32/bool/float32
tensors for the rest.

Legend: T tokens of one sample, L taps, D hidden, K top-k.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from osprey_data import jsonio
from osprey_data.errors import ConfigError, SampleNotFoundError, StoreCorruptError
from osprey_data.store.cache import PREFETCHER, CachedShardFS, open_cache
from osprey_data.store.fs import StoreFS
from osprey_data.store.journal import read_manifest
from osprey_data.store.manifest import Manifest, StoreHeader
from osprey_data.store.pool import DEFAULT_DECODE_THREADS
from osprey_data.store.records import Sample
from osprey_data.store.shard import TABLE_SCHEMA, ShardHandle

__all__ = ["StoreReader", "SHARDS_WITH_CHUNKS", "first_non_finite_row"]

# Shards whose decoded chunks a reader keeps (a few MB per array each), most recent first.
SHARDS_WITH_CHUNKS = 4

# float dtypes as unsigned integers: a value is NaN or Inf exactly when its exponent bits are all
# ones, i.e. when (bits & ~sign) >= the bits of +inf — one integer max instead of isfinite, which
# torch runs ~25x slower on bfloat16.
_BITS = {2: (np.uint16, 0x7FFF, 0x7F80), 4: (np.uint32, 0x7FFF_FFFF, 0x7F80_0000)}


def _conversation(raw: str, where: str) -> list:
    try:
        return jsonio.loads(raw)
    except ValueError as exc:  # JSONDecodeError (also too deep), UnicodeDecodeError
        raise StoreCorruptError(f"{where}: conversation is not valid JSON ({exc})") from None


def first_non_finite_row(x: Any) -> int | None:
    """Index along axis 0 of the first row of ``x`` (bf16 torch or float32 numpy) holding NaN or
    Inf; None when every value is finite."""
    if isinstance(x, np.ndarray):
        a = x
    else:
        import torch

        a = x.view(torch.int16).numpy()
    utype, mask, inf = _BITS[a.dtype.itemsize]
    bits = a.view(utype) & utype(mask)
    if a.size == 0 or bits.max() < inf:
        return None
    return int(np.nonzero((bits >= inf).reshape(a.shape[0], -1).any(axis=1))[0][0])


class StoreReader:
    """Read a store at a local path or fsspec URL (``memory://``, ``s3://`` ...)."""

    def __init__(self, url: str, *, storage_options: dict | None = None,
                 decode_threads: int = DEFAULT_DECODE_THREADS,
                 cache: str | os.PathLike | bool | None = "auto", prefetch: bool = True,
                 check_values: bool = True) -> None:
        """``decode_threads``: threads decoding the chunks of one sample in parallel (shared
        per process; 1 = decode inline, e.g. with many DataLoader workers).
        ``cache``: local copies of shard files — ``"auto"`` caches remote stores in
        ``$OSPREY_STORE_CACHE`` (default ``~/.cache/osprey/stores``; ``off`` disables), a path
        caches there (any store), ``False`` never. ``prefetch``: with a cache, download the
        shard being read and the next one in the background. ``check_values``: refuse
        (StoreCorruptError) a sample with NaN/Inf hidden states or log-probs."""
        if decode_threads < 1:
            raise ConfigError(f"decode_threads must be >= 1, got {decode_threads}")
        self.decode_threads = int(decode_threads)
        self.check_values = bool(check_values)
        self.url = url
        self.fs = StoreFS(url, storage_options=storage_options, read_only=True)
        self.manifest: Manifest = read_manifest(self.fs)
        self.cache = open_cache(self.fs, cache)
        self.prefetch = bool(prefetch) and self.cache is not None
        self._starts = np.cumsum([0] + [s.num_samples for s in self.manifest.shards]).tolist()
        self._handles: dict[int, ShardHandle] = {}
        self._with_chunks: OrderedDict[int, None] = OrderedDict()
        self._id_index: dict[str, int] | None = None

    # --- summary ------------------------------------------------------------------------

    @property
    def header(self) -> StoreHeader:
        return self.manifest.header

    @property
    def num_samples(self) -> int:
        return self.manifest.num_samples

    @property
    def num_tokens(self) -> int:
        return self.manifest.num_tokens

    def __len__(self) -> int:
        return self.num_samples

    @property
    def num_shards(self) -> int:
        return len(self.manifest.shards)

    def shard(self, k: int) -> ShardHandle:
        h = self._handles.get(k)
        if h is None:
            h = ShardHandle(self._shard_fs(k), self.header, self.manifest.shards[k],
                            decode_threads=self.decode_threads)
            self._handles[k] = h
            if self.prefetch:  # the rest of this shard, and the next one, in the background
                for j in (k, k + 1)[: self.num_shards - k]:
                    PREFETCHER.request(self._shard_fs(j))
        # Random access (a distill epoch's shuffled order) visits every shard; each keeps a few
        # decoded chunks per array, so only the most recent shards keep theirs (their commit
        # record and table stay: reopening costs nothing but the chunks read next).
        self._with_chunks[k] = None
        self._with_chunks.move_to_end(k)
        while len(self._with_chunks) > SHARDS_WITH_CHUNKS:
            old, _ = self._with_chunks.popitem(last=False)
            self._handles[old].release_chunks()
        return h

    def _shard_fs(self, k: int) -> StoreFS | CachedShardFS:
        return self.fs if self.cache is None else CachedShardFS(self.fs, self.cache, self.manifest.shards[k])

    # --- random access ------------------------------------------------------------------

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, row in that shard's table) of global sample ``i``."""
        if not -self.num_samples <= i < self.num_samples:
            raise IndexError(f"sample index {i} out of range for a store of {self.num_samples} samples")
        i %= self.num_samples
        k = bisect.bisect_right(self._starts, i) - 1
        return k, i - self._starts[k]

    def sample(self, i: int, *, as_torch: bool = False) -> Sample:
        k, row = self.locate(i)
        return self._sample(k, row, as_torch=as_torch)

    def __getitem__(self, i: int) -> Sample:
        return self.sample(i)

    def _sample(self, k: int, row: int, *, as_torch: bool) -> Sample:
        try:
            return self._read_sample(k, row, as_torch=as_torch)
        except StoreCorruptError:
            if self.cache is None:
                raise
            # Cached chunks are CRC-checked by the read itself (not twice): a damaged local copy
            # must not pass for a corrupt store, so drop the shard's copy and read the store again.
            self.cache.drop(self.manifest.shards[k])
            self._handles.pop(k, None)
            return self._read_sample(k, row, as_torch=as_torch)

    def _read_sample(self, k: int, row: int, *, as_torch: bool) -> Sample:
        h = self.shard(k)
        rec = h.row(row)
        a, n = int(rec["row_offset"]), int(rec["num_tokens"])
        where = f"sample {self._starts[k] + row} ({rec['sample_id']!r}) in {h.where}"
        if len(rec["token_ids"]) != n or len(rec["loss_mask"]) != n or a + n > h.info.num_tokens:
            raise StoreCorruptError(f"{where}: table row lengths/offsets disagree with num_tokens={n}")
        try:
            hidden = h.decode_hidden("hidden", a, a + n, as_torch=as_torch)
            final = (h.decode_hidden("final_hidden", a, a + n, as_torch=as_torch)
                     if self.header.has_final_hidden else None)
            ids = h.reader("topk_ids").read_rows(a, a + n)
            lps = h.reader("topk_logprobs").read_rows(a, a + n)
        except StoreCorruptError as exc:
            raise StoreCorruptError(f"{where}: {exc}") from None
        if self.check_values:
            for name, x in (("hidden", hidden), ("final_hidden", final), ("topk_logprobs", lps)):
                bad = None if x is None else first_non_finite_row(x)
                if bad is not None:
                    raise StoreCorruptError(f"{where}: {name} has NaN/Inf at token {bad}; the store is damaged "
                                            "(`osprey data validate` lists every such sample)")
        tok, mask = rec["token_ids"], rec["loss_mask"]
        if as_torch:
            import torch

            tok, mask = torch.from_numpy(tok), torch.from_numpy(mask)
            ids, lps = torch.from_numpy(ids), torch.from_numpy(lps)
        return Sample(
            sample_id=rec["sample_id"], domain=rec["domain"], source=rec["source"],
            conversation=_conversation(rec["conversation"], where), token_ids=tok, loss_mask=mask,
            prompt_length=int(rec["prompt_length"]), finish_reason=rec["finish_reason"],
            hidden_TLD=hidden, topk_ids_TK=ids, topk_logprobs_TK=lps, final_hidden_TD=final,
            index=self._starts[k] + row, shard_id=h.info.shard_id,
        )

    def iter_samples(self, as_torch: bool = False) -> Iterator[Sample]:
        """All samples in store order, shard by shard (chunk reads are reused across samples)."""
        for k, info in enumerate(self.manifest.shards):
            for row in range(info.num_samples):
                yield self._sample(k, row, as_torch=as_torch)
            self._handles.pop(k, None)  # free the shard's chunk cache
            self._with_chunks.pop(k, None)

    def __iter__(self) -> Iterator[Sample]:
        return self.iter_samples()

    # --- tables -------------------------------------------------------------------------

    def table(self, columns: list[str] | None = None) -> pa.Table:
        """Per-sample metadata of all shards (Arrow), plus ``shard_id`` and global ``index``."""
        parts = []
        for k, info in enumerate(self.manifest.shards):
            t = self.shard(k).table()
            t = t.append_column("shard_id", pa.array([info.shard_id] * t.num_rows, pa.string()))
            t = t.append_column("index", pa.array(np.arange(self._starts[k], self._starts[k + 1]), pa.int64()))
            parts.append(t if columns is None else t.select(list(columns)))
        if not parts:
            empty = pa.table({n: pa.array([], type=TABLE_SCHEMA.field(n).type) for n in TABLE_SCHEMA.names})
            empty = empty.append_column("shard_id", pa.array([], pa.string()))
            empty = empty.append_column("index", pa.array([], pa.int64()))
            return empty if columns is None else empty.select(list(columns))
        return pa.concat_tables(parts)

    def index_of(self, sample_id: str) -> int:
        if self._id_index is None:
            ids = self.table(["sample_id"]).column(0).to_pylist()
            self._id_index = {sid: i for i, sid in enumerate(ids)}
        try:
            return self._id_index[sample_id]
        except KeyError:
            raise SampleNotFoundError(f"sample id {sample_id!r} is not in store {self.url}") from None

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "num_samples": self.num_samples, "num_tokens": self.num_tokens,
                "num_shards": self.num_shards}

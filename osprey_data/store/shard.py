"""One shard on disk: ``shards/<id>/{samples.parquet, tokens.zarr/, _COMMIT.json}``.

:class:`ShardBuilder` streams samples into a not-yet-visible shard directory and finishes it
with ``_COMMIT.json`` (per-file size + CRC32C, array shapes, header hash) written LAST — its
sha256 is the shard checksum recorded in journals and the manifest. :class:`ShardHandle`
opens a committed shard for reading and verifies every byte it reads against that record.

Legend: N rows (tokens of the shard), T tokens of one sample, L taps, D hidden, K top-k.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from osprey_data import jsonio
from osprey_data.errors import (
    ManifestMismatchError, SchemaError, StoreCorruptError, StoreError, StoreNotFoundError,
)
from osprey_data.schema_check import validate
from osprey_data.store.codecs import HIDDEN_CODECS
from osprey_data.store.fs import StoreFS
from osprey_data.store.manifest import FORMAT_VERSION, ShardInfo, StoreHeader, header_hash
from osprey_data.store.pool import DEFAULT_DECODE_THREADS, decode_pool
from osprey_data.store.records import SampleRecord
from osprey_data.store.zarrio import ChunkedArrayReader, ChunkedArrayWriter, file_entry, group_metadata

__all__ = ["COMMIT_FILE", "TABLE_FILE", "ZARR_DIR", "TABLE_SCHEMA", "ShardBuilder", "ShardHandle",
           "TABLE_READ_OPTIONS", "read_table_bytes", "stored_arrays", "array_attributes", "check_table_layout", "parse_commit",
           "info_from_commit", "missing_files"]

# How every shard table is read. Single-threaded: a table is small (one row per sample), and
# pyarrow's threaded Parquet reader intermittently aborts the interpreter at exit ("terminate
# called without an active exception", apache/arrow#34314) — measured here on pyarrow 26: 2-12
# aborts in 60 fresh processes reading 30 tables with threads, 0 in 150 without. An Arrow buffer
# rather than io.BytesIO keeps Python file objects (and the GIL) out of Arrow's threads too.
TABLE_READ_OPTIONS = {"use_threads": False}


def read_table_bytes(data: bytes, columns: list[str] | None = None) -> pa.Table:
    """A Parquet table from ``data`` without starting any Arrow thread.

    ``pq.read_table`` goes through the dataset scanner, which starts a worker of Arrow's global
    thread pool even with ``use_threads=False``; that worker, left idle when the interpreter exits
    right after one table was read (``osprey data validate --no-values`` on a one-shard store),
    aborted the process with SIGABRT after its verdict in 9 of 20 runs (issue #25 item 15).
    ``ParquetFile.read`` without threads or pre-buffering reads on the calling thread only: 0 of
    40. Tested by ``tests/data/store/test_faults_25.py``."""
    f = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False)
    return f.read(columns=columns, **TABLE_READ_OPTIONS)

COMMIT_FILE = "_COMMIT.json"
TABLE_FILE = "samples.parquet"
ZARR_DIR = "tokens.zarr"

TABLE_SCHEMA = pa.schema([
    ("sample_id", pa.string()),
    ("domain", pa.string()),
    ("source", pa.string()),
    ("conversation", pa.string()),
    ("token_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.bool_())),
    ("row_offset", pa.int64()),
    ("num_tokens", pa.int32()),
    ("prompt_length", pa.int32()),
    ("finish_reason", pa.string()),
])


def stored_arrays(header: StoreHeader) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """Every Zarr array of a shard: name -> (dtype, per-row shape, chunk compression)."""
    L, D, K = header.num_taps, header.target.hidden_size, header.topk
    codec = HIDDEN_CODECS[header.hidden_codec]
    out: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for p in codec.parts(L, D):
        out["hidden" + p.suffix] = (p.dtype, p.per_row_shape, p.compression)
    out["topk_ids"] = ("int32", (K,), "blosc-zstd")
    out["topk_logprobs"] = ("float32", (K,), "blosc-zstd")
    if header.has_final_hidden:
        for p in codec.parts(1, D):
            # stored without the singleton tap axis: final_hidden is (N, D)
            out["final_hidden" + p.suffix] = (p.dtype, p.per_row_shape[1:], p.compression)
    return out


def array_attributes(header: StoreHeader, name: str) -> dict[str, str]:
    """The Zarr ``attributes`` of a stored array (its hidden codec, or ``raw``)."""
    hidden = name.startswith(("hidden", "final_hidden"))
    return {"osprey_codec": header.hidden_codec if hidden else "raw"}


class ShardBuilder:
    """Writes one shard's files under ``rel_dir`` (a temp dir locally, the final dir on object stores)."""

    def __init__(self, fs: StoreFS, header: StoreHeader, *, shard_id: str, worker: str,
                 rel_dir: str) -> None:
        self.fs, self.header, self.shard_id, self.worker, self.rel_dir = fs, header, shard_id, worker, rel_dir
        self.codec = HIDDEN_CODECS[header.hidden_codec]
        self.files: dict[str, dict[str, int]] = {}
        self.rows: list[dict[str, Any]] = []
        self.num_tokens = 0
        fs.makedirs(rel_dir)
        self.arrays = {
            name: ChunkedArrayWriter(self._sink, f"{ZARR_DIR}/{name}", dtype, shape, compression=comp,
                                     attributes=array_attributes(header, name))
            for name, (dtype, shape, comp) in stored_arrays(header).items()
        }

    def _sink(self, rel: str, data: bytes) -> None:
        self.fs.write_bytes(f"{self.rel_dir}/{rel}", data)
        self.files[rel] = file_entry(data)

    def add(self, rec: SampleRecord) -> None:
        T = int(len(rec.token_ids))
        for suffix, part in self.codec.encode(rec.hidden_TLD).items():
            self.arrays["hidden" + suffix].append(part)
        self.arrays["topk_ids"].append(np.asarray(rec.topk_ids_TK, dtype=np.int32))
        self.arrays["topk_logprobs"].append(np.asarray(rec.topk_logprobs_TK, dtype=np.float32))
        if self.header.has_final_hidden:
            fh = rec.final_hidden_TD
            fh_T1D = fh.reshape(T, 1, -1)  # works for numpy and torch
            for suffix, part in self.codec.encode(fh_T1D).items():
                self.arrays["final_hidden" + suffix].append(part.reshape(T, *part.shape[2:]))
        self.rows.append({
            "sample_id": rec.sample_id, "domain": rec.domain, "source": rec.source,
            "conversation": json.dumps(rec.conversation, ensure_ascii=False),
            "token_ids": np.asarray(rec.token_ids, dtype=np.int32),
            "loss_mask": np.asarray(rec.loss_mask).astype(bool),
            "row_offset": self.num_tokens, "num_tokens": T,
            "prompt_length": int(rec.prompt_length), "finish_reason": rec.finish_reason,
        })
        self.num_tokens += T

    def finish(self) -> tuple[bytes, ShardInfo]:
        """Write table, metadata and finally ``_COMMIT.json``; return its bytes and the ShardInfo."""
        arrays_meta = {name: w.finish() for name, w in self.arrays.items()}
        self._sink(f"{ZARR_DIR}/zarr.json", group_metadata({"osprey_shard": self.shard_id}))
        cols = {name: [r[name] for r in self.rows] for name in TABLE_SCHEMA.names}
        table = pa.table(cols, schema=TABLE_SCHEMA)
        buf = pa.BufferOutputStream()  # Arrow's own buffer: no Python file object (TABLE_READ_OPTIONS)
        pq.write_table(table, buf, compression="zstd")
        self._sink(TABLE_FILE, buf.getvalue().to_pybytes())
        commit = {
            "format_version": FORMAT_VERSION, "shard_id": self.shard_id, "worker": self.worker,
            "header_sha256": header_hash(self.header), "num_samples": len(self.rows),
            "num_tokens": self.num_tokens, "arrays": arrays_meta, "files": self.files,
        }
        raw = json.dumps(commit, indent=1, sort_keys=True).encode()
        try:
            # create-only on object stores: a committed shard is never replaced, so two processes
            # running as the same worker fail here instead of overwriting each other's commit
            self.fs.write_atomic(f"{self.rel_dir}/{COMMIT_FILE}", raw, create_only=not self.fs.is_local)
        except FileExistsError:
            raise StoreError(f"{self.fs.where(self.rel_dir)}: already committed by another process writing as "
                             f"worker {self.worker}; run each worker index only once at a time") from None
        info = ShardInfo(
            shard_id=self.shard_id, worker=self.worker, num_samples=len(self.rows),
            num_tokens=self.num_tokens,
            num_bytes=sum(f["bytes"] for f in self.files.values()) + len(raw),
            commit_sha256=hashlib.sha256(raw).hexdigest(),
        )
        return raw, info


def parse_commit(raw: bytes, *, where: str) -> dict[str, Any]:
    """Parse a ``_COMMIT.json`` and check it against its schema."""
    try:
        doc = jsonio.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreCorruptError(f"{where}: commit record is not valid JSON ({exc})") from None
    try:
        validate(doc, "store-shard-commit.v1.json", where=where)
    except SchemaError as exc:
        raise StoreCorruptError(str(exc)) from None
    return doc


def check_table_layout(t: pa.Table, num_tokens: int, *, where: str) -> None:
    """What readers rely on in a shard's table: each row's tokens are the next ``num_tokens`` rows
    of the token arrays (row_offset = running sum, the rows tile the arrays exactly) and its
    token_ids / loss_mask have that many entries. A swapped offset would pair one sample's tokens
    with another's features; this makes it a StoreCorruptError naming the sample instead."""
    n_tok = t.column("num_tokens").to_numpy().astype(np.int64)
    offsets = t.column("row_offset").to_numpy().astype(np.int64)
    expect = np.concatenate([[0], np.cumsum(n_tok)[:-1]]) if len(n_tok) else n_tok
    bad = (offsets != expect) | (n_tok < 1)
    for name in ("token_ids", "loss_mask"):
        lengths = pc.list_value_length(t.column(name)).to_numpy(zero_copy_only=False)
        bad |= lengths.astype(np.int64) != n_tok
    if bad.any():
        j = int(np.nonzero(bad)[0][0])
        raise StoreCorruptError(
            f"{where}: sample {t.column('sample_id')[j].as_py()!r} (row {j}) has row_offset {offsets[j]}, "
            f"num_tokens {n_tok[j]}, expected offset {expect[j]} with token_ids/loss_mask of that length; "
            "the rows must tile the token arrays in order (damaged or edited table)")
    if int(n_tok.sum()) != num_tokens:
        raise StoreCorruptError(f"{where}: rows hold {int(n_tok.sum())} tokens, the manifest says {num_tokens}")


def missing_files(fs: StoreFS, rel_dir: str, doc: dict[str, Any]) -> list[str]:
    """What is wrong with the files a commit record lists (absent, or of another size) — checked
    before a shard is published or adopted, so a shard whose files are gone is never trusted."""
    problems = []
    for rel, entry in sorted(doc["files"].items()):
        try:
            actual = fs.size(f"{rel_dir}/{rel}")
        except FileNotFoundError:
            problems.append(f"{rel} is missing")
            continue
        if actual != entry["bytes"]:
            problems.append(f"{rel} has {actual} bytes, the commit record says {entry['bytes']}")
    return problems


def info_from_commit(raw: bytes, doc: dict[str, Any]) -> ShardInfo:
    return ShardInfo(
        shard_id=doc["shard_id"], worker=doc["worker"], num_samples=doc["num_samples"],
        num_tokens=doc["num_tokens"],
        num_bytes=sum(f["bytes"] for f in doc["files"].values()) + len(raw),
        commit_sha256=hashlib.sha256(raw).hexdigest(),
    )


class ShardHandle:
    """Read access to one committed shard; every byte read is checked against _COMMIT.json."""

    def __init__(self, fs: StoreFS, header: StoreHeader, info: ShardInfo, *,
                 decode_threads: int = DEFAULT_DECODE_THREADS) -> None:
        self.fs, self.header, self.info = fs, header, info
        self.decode_threads = int(decode_threads)
        self.rel_dir = f"shards/{info.shard_id}"
        self.where = fs.where(self.rel_dir)
        try:
            raw = fs.read_bytes(f"{self.rel_dir}/{COMMIT_FILE}")
        except StoreNotFoundError:
            raise StoreCorruptError(f"{self.where}: listed in manifest.json but its {COMMIT_FILE} "
                                    "is missing (shard deleted or never finished)") from None
        if hashlib.sha256(raw).hexdigest() != info.commit_sha256:
            raise StoreCorruptError(f"{self.where}/{COMMIT_FILE}: sha256 differs from manifest.json "
                                    "(the shard was modified or replaced)")
        self.commit = parse_commit(raw, where=f"{self.where}/{COMMIT_FILE}")
        if self.commit["header_sha256"] != header_hash(header):
            raise ManifestMismatchError(f"{self.where}: shard was written for a different target or "
                                        "build config than this store's manifest")
        expected = stored_arrays(header)
        for name, (dtype, shape, comp) in expected.items():
            meta = self.commit["arrays"].get(name)
            if (meta is None or meta["dtype"] != dtype or tuple(meta["shape"][1:]) != tuple(shape)
                    or meta["shape"][0] != info.num_tokens or meta.get("compression") != comp):
                raise StoreCorruptError(f"{self.where}: array {name} is {meta}, expected dtype {dtype} "
                                        f"shape ({info.num_tokens}, {', '.join(map(str, shape))})")
        self._table: pa.Table | None = None
        self._rows: dict[str, Any] | None = None
        self._readers: dict[str, ChunkedArrayReader] = {}

    def _read(self, rel: str, size: int) -> bytes:
        return self.fs.read_bytes(f"{self.rel_dir}/{rel}", size=size)

    def reader(self, name: str) -> ChunkedArrayReader:
        r = self._readers.get(name)
        if r is None:
            r = ChunkedArrayReader(self._read, f"{ZARR_DIR}/{name}", self.commit["arrays"][name],
                                   self.commit["files"], where=self.where)
            self._readers[name] = r
        return r

    def release_chunks(self) -> None:
        """Drop every array reader with its cached and recycled chunk buffers (memory); the
        commit record and table stay, and the next read starts afresh."""
        self._readers.clear()

    def table(self) -> pa.Table:
        if self._table is None:
            data = self.reader("topk_ids").read_verified(TABLE_FILE)
            try:
                t = read_table_bytes(data)
            except Exception as exc:  # pyarrow raises several types on damaged files
                raise StoreCorruptError(f"{self.where}/{TABLE_FILE}: unreadable ({exc})") from None
            if t.num_rows != self.info.num_samples or not t.schema.equals(TABLE_SCHEMA):
                raise StoreCorruptError(f"{self.where}/{TABLE_FILE}: {t.num_rows} rows / schema "
                                        f"mismatch, expected {self.info.num_samples} samples")
            check_table_layout(t, self.info.num_tokens, where=f"{self.where}/{TABLE_FILE}")
            self._table = t
        return self._table

    def row(self, j: int) -> dict[str, Any]:
        """Table row ``j`` with token_ids / loss_mask as numpy arrays (no Python lists)."""
        if self._rows is None:
            t = self.table()
            tok = t.column("token_ids").combine_chunks()
            mask = t.column("loss_mask").combine_chunks()
            self._rows = {
                "scalars": t.drop_columns(["token_ids", "loss_mask"]).to_pylist(),
                "tok_flat": tok.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
                "tok_off": tok.offsets.to_numpy(),
                "mask_flat": mask.values.to_numpy(zero_copy_only=False).astype(bool, copy=False),
                "mask_off": mask.offsets.to_numpy(),
            }
        r = self._rows
        out = dict(r["scalars"][j])
        out["token_ids"] = r["tok_flat"][r["tok_off"][j]: r["tok_off"][j + 1]].copy()
        out["loss_mask"] = r["mask_flat"][r["mask_off"][j]: r["mask_off"][j + 1]].copy()
        return out

    def decode_hidden(self, name: str, start: int, stop: int, *, as_torch: bool) -> Any:
        """Hidden states of rows ``start:stop`` (float32 numpy, or bfloat16 torch).

        The output is allocated once; the chunks of every part are read, verified and
        decompressed (on the decode pool when ``decode_threads > 1``), then each piece of the
        range that lies inside one chunk of every part is decoded straight into the output
        from views of those chunks: no concatenation, no second copy of the result. With a
        ``direct_bits`` codec and torch output, chunks inside the range are decompressed
        straight into the output (not cached: no later sample needs them).
        """
        codec = HIDDEN_CODECS[self.header.hidden_codec]
        names = [n for n in self.commit["arrays"] if n == name or n.startswith(name + "_")]
        readers = {n[len(name):]: self.reader(n) for n in names}
        main = readers["_hi"] if "_hi" in readers else readers[""]
        shape = (stop - start, *main.shape[1:])
        if not 0 <= start <= stop <= main.shape[0]:
            raise StoreCorruptError(f"{self.where}: rows {start}:{stop} outside array {name} "
                                    f"of {main.shape[0]} rows")
        if as_torch:
            import torch

            # numpy's allocator reuses freed multi-MB blocks; torch.empty page-faults afresh
            out = torch.from_numpy(np.empty(shape, dtype=np.int16)).view(torch.bfloat16)
        else:
            out = np.empty(shape, dtype=np.float32)
        pool = decode_pool(self.decode_threads)
        loaded: dict[str, dict[int, Any]] = {}
        # chunks lying entirely inside the range decompress straight into the output when the
        # codec's one part holds the output's very bits (bf16-blosc read as torch bfloat16)
        direct_into = (out.view(torch.int16).numpy() if as_torch and codec.direct_bits
                       and len(readers) == 1 and main.decodes_into else None)
        direct: set[int] = set()
        try:
            tasks = []  # one task list over all parts, so the pool sees every chunk at once
            for sfx, r in readers.items():
                loaded[sfx], missing = r.take(r.chunk_ids(start, stop))
                if direct_into is not None:
                    R = r.chunk_rows
                    direct = {i for i in missing if start <= i * R and (i + 1) * R <= stop}
                    tasks += [(None, i) for i in sorted(direct)]
                tasks += [(sfx, i) for i in missing if i not in direct]

            def load(task: tuple[str | None, int]) -> None:
                sfx, i = task
                if sfx is None:
                    R = main.chunk_rows
                    main.load_into(i, direct_into[i * R - start: (i + 1) * R - start])
                else:
                    loaded[sfx][i] = readers[sfx].load(i)

            if pool is None or len(tasks) < 2:
                for t in tasks:
                    load(t)
            else:
                list(pool.map(load, tasks))

            cuts = sorted({start, stop, *(b for r in readers.values() for b in r.boundaries(start, stop))})

            def piece(ab: tuple[int, int]) -> None:
                a, b = ab
                parts = {}
                for sfx, r in readers.items():
                    i = a // r.chunk_rows
                    off = i * r.chunk_rows
                    v = loaded[sfx][i][1][a - off: b - off]
                    parts[sfx] = v[:, None] if name == "final_hidden" else v  # codecs see (N, taps, D)
                dst = out[a - start: b - start]
                dst = dst[:, None] if name == "final_hidden" else dst
                if as_torch:
                    codec.decode_torch(parts, out=dst)
                else:
                    codec.decode(parts, out=dst)

            segments = [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if a // main.chunk_rows not in direct]
            if pool is None or len(segments) < 2:
                for ab in segments:
                    piece(ab)
            else:
                list(pool.map(piece, segments))
        finally:
            for sfx, got in loaded.items():
                readers[sfx].keep(got)  # last chunks stay cached, other buffers are recycled
        return out

"""A minimal Zarr v3 array writer/reader for append-only per-token arrays.

Chunk compression per array (``COMPRESSIONS``): ``blosc-zstd`` (byte shuffle + zstd, the
default), ``blosc-zstd-fast`` (byte shuffle + zstd level 1 in 1 MiB blocks: bf16 hidden states),
``zstd`` (plain zstd frames), ``zstd-raw`` (zstd level -1 for noise) or ``none`` — all standard
Zarr v3 codecs.

Why not drive the ``zarr`` package directly: the shard writer must (a) stream rows in without
rewriting partial chunks, (b) know the exact bytes of every file it writes to record a CRC in
the shard's commit record, and (c) verify those CRCs when reading so that a flipped bit is a
clear StoreCorruptError rather than silently wrong numbers. So we encode chunks ourselves with
standard Zarr v3 codec chains and write the
standard ``zarr.json`` metadata; any Zarr v3 implementation can open the result (tested with
``zarr.open_group``). Only the first dimension (rows = tokens) is chunked.

Legend: N rows (tokens), R rows per chunk.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import google_crc32c  # a dependency of zarr 3 (its crc32c codec): hardware CRC32C
import numcodecs
import numpy as np

from osprey_data.errors import StoreCorruptError, StoreNotFoundError

__all__ = ["CHUNK_TARGET_BYTES", "ZSTD_LEVEL", "ChunkedArrayWriter", "ChunkedArrayReader",
           "choose_chunk_rows", "group_metadata", "array_metadata", "array_files", "file_entry", "verify_file"]

# Aim for chunks of ~2 MiB uncompressed: large enough that per-object overhead (S3 GETs,
# blosc headers) vanishes, small enough that random access to one sample reads little extra.
CHUNK_TARGET_BYTES = 2 << 20
ZSTD_LEVEL = 3
# Plain zstd (used on byte planes of hidden states): level 1 compresses activation exponents as
# well as level 3 here and encodes ~3x faster.
ZSTD_FAST_LEVEL = 1
# Noise-like byte planes (bf16 mantissas): zstd's negative "fast" level stores incompressible
# blocks raw (decoding ~ memcpy) yet still squeezes the zero padding of a shard's last chunk.
ZSTD_RAW_LEVEL = -1
# bf16 hidden states (``bf16-blosc`` codec): Blosc byte-shuffles each 1 MiB block (sign/exponent
# bytes, then mantissa bytes) and zstd-1 compresses it; the exponent half compresses ~2.6x,
# the mantissa half is stored raw by zstd. Decoding unshuffles in cache straight into the
# destination: ~2x faster than decompressing two byte planes and interleaving them with numpy
# (whole reads: ~1.35x),
# at the same size (smaller blocks lose ratio: 0.79 at Blosc's automatic size vs 0.69).
BLOSC_FAST_BLOCK = 1 << 20
COMPRESSIONS = ("blosc-zstd", "blosc-zstd-fast", "zstd", "zstd-raw", "none")
_DIM_NAMES = {1: ["token"], 2: ["token", "k"], 3: ["token", "tap", "channel"]}


def file_entry(data: bytes) -> dict[str, int]:
    """The commit-record entry of a file: its size and CRC32C (Castagnoli).

    CRC32C rather than zlib's CRC32: with SSE4.2/ARMv8 instructions it runs at ~10 GB/s against
    ~1.5 GB/s, which makes verifying every chunk on every read nearly free next to decoding.
    """
    return {"bytes": len(data), "crc32c": google_crc32c.value(data)}


def verify_file(data: bytes, entry: dict[str, int], *, where: str, rel: str) -> None:
    """Raise StoreCorruptError unless ``data`` matches its commit-record ``entry``.

    Entries carry ``crc32c`` (current writers) or ``crc32`` (zlib; stores written before the
    switch) — both are accepted, never neither (the schema requires one).
    """
    if len(data) != entry["bytes"]:
        raise StoreCorruptError(f"{where}: {rel} is truncated or padded "
                                f"({len(data)} bytes, expected {entry['bytes']})")
    if "crc32c" in entry:
        if google_crc32c.value(data) != entry["crc32c"]:
            raise StoreCorruptError(f"{where}: {rel} fails its CRC32C check (corrupted)")
    elif "crc32" in entry:
        if zlib.crc32(data) != entry["crc32"]:
            raise StoreCorruptError(f"{where}: {rel} fails its CRC32 check (corrupted)")
    else:
        raise StoreCorruptError(f"{where}: {rel} has no checksum in _COMMIT.json")


# recycled chunk buffers kept per array (a sample spans a few chunks of each part)
_MAX_FREE = 8


def _blosc_content_size(frame: bytes) -> int | None:
    """Decompressed size in a Blosc 1 header (bytes 4..8, little-endian), or None."""
    if len(frame) < 16:
        return None
    return int.from_bytes(frame[4:8], "little")


def _zstd_content_size(frame: bytes) -> int | None:
    """Decompressed size declared in a zstd frame header, or None when absent/unparsable."""
    if len(frame) < 6 or frame[:4] != b"\x28\xb5\x2f\xfd":
        return None
    desc = frame[4]
    fcs_flag, single, dict_flag = desc >> 6, (desc >> 5) & 1, desc & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or len(frame) < pos + size:
        return None
    value = int.from_bytes(frame[pos: pos + size], "little")
    return value + 256 if size == 2 else value


_blosc_thread: ThreadPoolExecutor | None = None
_blosc_thread_pid = 0


def _decompress(codec: Any, data: bytes, out: np.ndarray | None = None) -> Any:
    """``codec.decode(data, out)``, keeping Blosc single-threaded.

    numcodecs runs Blosc on Blosc's own thread pool when called from the main thread (its
    ``use_threads=None`` default) and single-threaded anywhere else. A chunk holds only one or
    two Blosc blocks, so that pool halves decode speed here (41 vs 82 ms for 100 MB); the
    parallelism comes from the reader's decode pool instead. A main-thread Blosc decode
    therefore runs on one helper thread (a hand-off costs microseconds against ~1 ms per chunk),
    without changing numcodecs' process-wide setting for other users.
    """
    global _blosc_thread, _blosc_thread_pid
    if not isinstance(codec, numcodecs.Blosc) or threading.current_thread() is not threading.main_thread():
        return codec.decode(data, out=out)
    if _blosc_thread is None or _blosc_thread_pid != os.getpid():  # recreated after a fork
        _blosc_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osprey-blosc")
        _blosc_thread_pid = os.getpid()
    return _blosc_thread.submit(codec.decode, data, out).result()


def choose_chunk_rows(row_bytes: int, *, target_bytes: int | None = None) -> int:
    target = CHUNK_TARGET_BYTES if target_bytes is None else target_bytes
    rows = max(1, target // max(1, row_bytes))
    return 1 << (rows.bit_length() - 1)  # power of two


class _Raw:
    """No compression (for noise-like byte planes): Zarr v3 chain is just ``bytes``."""

    def encode(self, a: np.ndarray) -> bytes:
        return np.ascontiguousarray(a).tobytes()

    def decode(self, b: bytes) -> bytes:
        return b


def _compressor(name: str, itemsize: int):
    if name == "blosc-zstd":
        shuffle = numcodecs.Blosc.SHUFFLE if itemsize > 1 else numcodecs.Blosc.NOSHUFFLE
        return numcodecs.Blosc(cname="zstd", clevel=ZSTD_LEVEL, shuffle=shuffle, blocksize=0)
    if name == "blosc-zstd-fast":
        shuffle = numcodecs.Blosc.SHUFFLE if itemsize > 1 else numcodecs.Blosc.NOSHUFFLE
        return numcodecs.Blosc(cname="zstd", clevel=ZSTD_FAST_LEVEL, shuffle=shuffle, blocksize=BLOSC_FAST_BLOCK)
    if name == "zstd":
        return numcodecs.Zstd(level=ZSTD_FAST_LEVEL)
    if name == "zstd-raw":
        return numcodecs.Zstd(level=ZSTD_RAW_LEVEL)
    if name == "none":
        return _Raw()
    raise ValueError(f"unknown chunk compression {name!r}; known: {COMPRESSIONS}")


def _codec_metadata(name: str, itemsize: int) -> list[dict[str, Any]]:
    chain: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if name in ("blosc-zstd", "blosc-zstd-fast"):
        fast = name == "blosc-zstd-fast"
        chain.append({"name": "blosc", "configuration": {
            "cname": "zstd", "clevel": ZSTD_FAST_LEVEL if fast else ZSTD_LEVEL,
            "shuffle": "shuffle" if itemsize > 1 else "noshuffle",
            "typesize": itemsize, "blocksize": BLOSC_FAST_BLOCK if fast else 0}})
    elif name in ("zstd", "zstd-raw"):
        level = ZSTD_FAST_LEVEL if name == "zstd" else ZSTD_RAW_LEVEL
        chain.append({"name": "zstd", "configuration": {"level": level, "checksum": False}})
    return chain


def group_metadata(attributes: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes or {}},
                      indent=1).encode()


def array_metadata(shape: list[int], dtype: np.dtype, chunk_rows: int,
                   attributes: dict[str, Any], compression: str) -> bytes:
    """The ``zarr.json`` of an array: what the writer writes, and what validate expects."""
    doc = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk_rows, *shape[1:]]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": _codec_metadata(compression, dtype.itemsize),
        "attributes": attributes,
        "dimension_names": _DIM_NAMES.get(len(shape), [f"dim{i}" for i in range(len(shape))]),
    }
    return json.dumps(doc, indent=1).encode()


def _chunk_key(i: int, ndim: int) -> str:
    return "c/" + "/".join([str(i)] + ["0"] * (ndim - 1))


def array_files(rel_dir: str, meta: dict[str, Any]) -> tuple[str, list[str]]:
    """(metadata file, chunk files) of an array written with commit-record metadata ``meta``."""
    shape, rows = meta["shape"], int(meta["chunk_rows"])
    chunks = -(-int(shape[0]) // rows)
    return f"{rel_dir}/zarr.json", [f"{rel_dir}/{_chunk_key(i, len(shape))}" for i in range(chunks)]


class ChunkedArrayWriter:
    """Append rows; full chunks go to ``sink(rel_path, bytes)`` as soon as they fill up."""

    def __init__(self, sink: Callable[[str, bytes], None], rel_dir: str, dtype: str,
                 per_row_shape: tuple[int, ...], *, attributes: dict[str, Any] | None = None,
                 chunk_rows: int | None = None, compression: str = "blosc-zstd") -> None:
        self.sink = sink
        self.compression = compression
        self.rel_dir = rel_dir
        self.dtype = np.dtype(dtype)
        self.per_row_shape = tuple(int(s) for s in per_row_shape)
        row_bytes = int(np.prod(self.per_row_shape, dtype=np.int64)) * self.dtype.itemsize
        self.chunk_rows = chunk_rows or choose_chunk_rows(row_bytes)
        self.attributes = dict(attributes or {})
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0
        self._rows_written = 0
        self._codec = _compressor(compression, self.dtype.itemsize)

    @property
    def num_rows(self) -> int:
        return self._rows_written + self._pending_rows

    def append(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        if rows.dtype != self.dtype or rows.shape[1:] != self.per_row_shape:
            raise ValueError(f"{self.rel_dir}: got rows {rows.dtype}{rows.shape}, "
                             f"expected {self.dtype}(N, {self.per_row_shape})")
        self._pending.append(rows)
        self._pending_rows += rows.shape[0]
        if self._pending_rows >= self.chunk_rows:
            buf = np.concatenate(self._pending, axis=0)
            n_full = buf.shape[0] // self.chunk_rows
            for j in range(n_full):
                self._emit(buf[j * self.chunk_rows:(j + 1) * self.chunk_rows])
            rest = buf[n_full * self.chunk_rows:]
            self._pending = [rest] if rest.shape[0] else []
            self._pending_rows = rest.shape[0]

    def _emit(self, chunk: np.ndarray) -> None:
        idx = self._rows_written // self.chunk_rows
        data = self._codec.encode(np.ascontiguousarray(chunk))
        self.sink(f"{self.rel_dir}/{_chunk_key(idx, 1 + len(self.per_row_shape))}", bytes(data))
        self._rows_written += chunk.shape[0]

    def finish(self) -> dict[str, Any]:
        """Write the last (zero-padded, as Zarr v3 requires) chunk and ``zarr.json``."""
        total = self.num_rows
        if self._pending_rows:
            buf = np.concatenate(self._pending, axis=0)
            padded = np.zeros((self.chunk_rows, *self.per_row_shape), dtype=self.dtype)
            padded[: buf.shape[0]] = buf
            idx = self._rows_written // self.chunk_rows
            data = self._codec.encode(padded)
            self.sink(f"{self.rel_dir}/{_chunk_key(idx, 1 + len(self.per_row_shape))}", bytes(data))
            self._pending, self._pending_rows = [], 0
        self._rows_written = total
        shape = [total, *self.per_row_shape]
        self.sink(f"{self.rel_dir}/zarr.json",
                  array_metadata(shape, self.dtype, self.chunk_rows, self.attributes, self.compression))
        return {"shape": shape, "dtype": self.dtype.name, "chunk_rows": self.chunk_rows,
                "compression": self.compression}


class ChunkedArrayReader:
    """Row-range reads of one array written by :class:`ChunkedArrayWriter`, CRC32C-verified.

    Decoded chunks are kept in a small LRU (``cache_chunks``), so sequential reads of samples
    that share a chunk decode it once; memory is bounded by ``cache_chunks`` chunks (~2 MiB
    each) plus a few recycled buffers. Decompression writes into the buffer of an evicted chunk
    instead of a fresh allocation (fresh multi-MB buffers cost page faults that rival zstd
    itself), so a view returned with ``copy=False`` is only valid until the next read on this
    reader. :meth:`load` is thread-safe, so a caller may decode several chunks on a thread pool
    (zstd, CRC32C and numpy release the GIL): :meth:`take`, :meth:`load`, then :meth:`keep`.
    """

    def __init__(self, read: Callable[[str, int], bytes], rel_dir: str, expected: dict[str, Any],
                 files: dict[str, dict[str, int]], *, where: str, cache_chunks: int = 2) -> None:
        self._read = read
        self.rel_dir = rel_dir
        self.where = where
        self.files = files
        self.shape = tuple(expected["shape"])
        self.dtype = np.dtype(expected["dtype"])
        self.chunk_rows = int(expected["chunk_rows"])
        self.compression = expected.get("compression", "blosc-zstd")
        self._codec = _compressor(self.compression, self.dtype.itemsize)
        self._cache: OrderedDict[int, tuple[np.ndarray | None, np.ndarray]] = OrderedDict()
        self._cache_chunks = max(1, cache_chunks)
        # buffers of evicted chunks, reused by the next decode (list.pop/append are atomic,
        # so decoding threads may share it)
        self._free: list[np.ndarray] = []
        self._per_row = int(np.prod(self.shape[1:], dtype=np.int64))

    def read_verified(self, rel: str) -> bytes:
        """Bytes of ``rel`` (relative to the shard), checked against the commit record (the size
        before anything is read: ``read(rel, size)`` refuses a file of another size)."""
        entry = self.files.get(rel)
        if entry is None:
            raise StoreCorruptError(f"{self.where}: {rel} is not listed in the shard's _COMMIT.json")
        try:
            data = self._read(rel, int(entry["bytes"]))
        except StoreNotFoundError:
            raise StoreCorruptError(f"{self.where}: {rel} is missing (listed in _COMMIT.json)") from None
        verify_file(data, entry, where=self.where, rel=rel)
        return data

    def _content_size(self, data: bytes) -> int | None:
        """Decompressed bytes a chunk declares in its frame header (None: unknown)."""
        if self.compression in ("zstd", "zstd-raw"):
            return _zstd_content_size(data)
        if self.compression.startswith("blosc"):
            return _blosc_content_size(data)
        return None

    def _decode(self, rel: str, data: bytes) -> tuple[np.ndarray, bool]:
        """Decompress one verified chunk: (flat array of ``chunk_rows`` rows, whether it is a
        buffer of ours that may be recycled)."""
        n = self.chunk_rows * self._per_row
        try:
            if self._content_size(data) == n * self.dtype.itemsize:
                # decompress straight into a recycled buffer (the frame states its exact size)
                try:
                    buf = self._free.pop()
                except IndexError:
                    buf = np.empty(n, dtype=self.dtype)
                _decompress(self._codec, data, buf.view(np.uint8))
                arr, own = buf, True
            else:
                arr, own = np.frombuffer(_decompress(self._codec, data), dtype=self.dtype), False
        except Exception as exc:  # blosc/zstd raise bare RuntimeError/ValueError on garbage
            raise StoreCorruptError(f"{self.where}: {rel} cannot be decompressed ({exc})") from None
        if arr.size != n:
            raise StoreCorruptError(f"{self.where}: {rel} decodes to {arr.size} values, expected {n}")
        return arr, own

    @property
    def decodes_into(self) -> bool:
        """Whether :meth:`load_into` works: the chunk frames state their decompressed size."""
        return self.compression != "none"

    def load_into(self, i: int, dst: np.ndarray) -> None:
        """Read, verify and decompress chunk ``i`` straight into ``dst`` (thread-safe): a
        C-contiguous array of ``chunk_rows`` rows with this array's item size, e.g. the rows of
        the caller's output that the chunk covers entirely. No cache, no extra copy."""
        assert dst.flags.c_contiguous and dst.nbytes == self.chunk_rows * self._per_row * self.dtype.itemsize
        rel = f"{self.rel_dir}/{_chunk_key(i, len(self.shape))}"
        data = self.read_verified(rel)
        size = self._content_size(data)
        if size != dst.nbytes:
            raise StoreCorruptError(f"{self.where}: {rel} decodes to {size} bytes, expected {dst.nbytes}")
        try:
            _decompress(self._codec, data, dst.reshape(-1).view(np.uint8))
        except Exception as exc:
            raise StoreCorruptError(f"{self.where}: {rel} cannot be decompressed ({exc})") from None

    def load(self, i: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Read, verify and decode chunk ``i`` (thread-safe): (recyclable buffer or None, view)."""
        rel = f"{self.rel_dir}/{_chunk_key(i, len(self.shape))}"
        buf, own = self._decode(rel, self.read_verified(rel))
        view = buf.reshape(self.chunk_rows, *self.shape[1:])
        view.flags.writeable = False  # cached: callers must never modify it in place
        return (buf if own else None), view

    def _recycle(self, buf: np.ndarray | None) -> None:
        if buf is not None and len(self._free) < _MAX_FREE:
            self._free.append(buf)

    def _insert(self, i: int, entry: tuple[np.ndarray | None, np.ndarray]) -> None:
        self._cache[i] = entry
        self._cache.move_to_end(i)
        while len(self._cache) > self._cache_chunks:
            _, (old, _) = self._cache.popitem(last=False)
            self._recycle(old)

    def _chunk(self, i: int) -> np.ndarray:
        hit = self._cache.get(i)
        if hit is not None:
            self._cache.move_to_end(i)
            return hit[1]
        entry = self.load(i)
        self._insert(i, entry)
        return entry[1]

    def chunk_ids(self, start: int, stop: int) -> range:
        """Chunks holding rows ``start:stop``."""
        if stop <= start:
            return range(0)
        return range(start // self.chunk_rows, (stop - 1) // self.chunk_rows + 1)

    def take(self, ids) -> tuple[dict[int, tuple[np.ndarray | None, np.ndarray]], list[int]]:
        """Take chunks ``ids`` out of the cache for parallel use: (the cached ones, the ids
        still to :meth:`load`). Hand everything back with :meth:`keep`."""
        have, missing = {}, []
        for i in ids:
            hit = self._cache.pop(i, None)
            if hit is None:
                missing.append(i)
            else:
                have[i] = hit
        return have, missing

    def keep(self, loaded: dict[int, tuple[np.ndarray | None, np.ndarray]]) -> None:
        """Hand back chunks from :meth:`take` / :meth:`load`: the last ones stay cached
        (sequential reads continue there), the buffers of the rest are recycled. Until then
        nothing else can overwrite them."""
        for i in sorted(loaded):
            self._insert(i, loaded[i])

    def num_chunks(self) -> int:
        return -(-self.shape[0] // self.chunk_rows)

    def boundaries(self, start: int, stop: int) -> list[int]:
        """Chunk boundaries strictly inside ``start:stop``."""
        first = start // self.chunk_rows + 1
        return list(range(first * self.chunk_rows, stop, self.chunk_rows))

    def read_rows(self, start: int, stop: int, *, copy: bool = True) -> np.ndarray:
        """Rows ``start:stop``; ``copy=False`` may return a view of a cached chunk, valid until
        the next read on this reader (do not modify it)."""
        if not 0 <= start <= stop <= self.shape[0]:
            raise StoreCorruptError(f"{self.where}: rows {start}:{stop} outside array {self.rel_dir} "
                                    f"of {self.shape[0]} rows")
        first, last = start // self.chunk_rows, max(start, stop - 1) // self.chunk_rows
        if first == last:
            c = self._chunk(first)
            off = first * self.chunk_rows
            view = c[start - off: stop - off]
            return view.copy() if copy else view
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        pos = 0
        for i in range(first, last + 1):
            c = self._chunk(i)
            off = i * self.chunk_rows
            a, b = max(start, off) - off, min(stop, off + self.chunk_rows) - off
            out[pos: pos + b - a] = c[a:b]
            pos += b - a
        return out

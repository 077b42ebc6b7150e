"""``validate_store``: a full integrity check of a store, reporting every problem found.

Checks, in order: manifest (presence, JSON, format version, schema, totals, unique shards); per
listed shard: commit record (presence, sha256 vs manifest, schema, header), the set of files it
lists against the shard's arrays (nothing missing, nothing extra), the size and CRC32C of every
listed file, array shapes/dtypes, every ``zarr.json`` against the header (what an external Zarr
reader trusts), table schema, row offsets, per-sample lengths, prompt lengths, token ids in
range, duplicate sample ids across shards; then the values: NaN/Inf in hidden states and
log-probs, top-k ids in range, log-probs <= 0 and sorted descending. Problems name the shard
and the sample. Unlisted shard folders (temp dirs of running or crashed writers, unmerged
shards) are reported as notes, not problems — readers never see them.

With values checked (the default) every chunk is verified while it is decoded; without
(``--no-values``) every chunk is verified on its own. Either way every file of every commit
record is read and checked once.

Legend: N rows of a shard, L taps, D hidden, K top-k.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from osprey_data import jsonio
from osprey_data.errors import OspreyError, StoreNotFoundError
from osprey_data.store.fs import StoreFS
from osprey_data.store.journal import read_manifest
from osprey_data.store.shard import TABLE_FILE, ZARR_DIR, ShardHandle, array_attributes, stored_arrays
from osprey_data.store.zarrio import array_files, array_metadata, group_metadata
from osprey_data.text import printable

__all__ = ["Problem", "ValidationReport", "validate_store"]


@dataclass
class Problem:
    """One thing wrong with a store."""

    shard: str | None
    sample: str | None
    message: str

    def __str__(self) -> str:
        where = " ".join(x for x in (f"shard {self.shard}" if self.shard else "",
                                     f"sample {self.sample!r}" if self.sample else "") if x)
        return f"{where}: {self.message}" if where else self.message


@dataclass
class ValidationReport:
    """Outcome of :func:`validate_store`; ``ok`` is False when any problem was found."""

    url: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    num_shards: int = 0
    num_samples: int = 0
    num_tokens: int = 0
    bytes_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "ok": self.ok, "problems": [str(p) for p in self.problems],
                "notes": self.notes, "num_shards": self.num_shards, "num_samples": self.num_samples,
                "num_tokens": self.num_tokens, "bytes_checked": self.bytes_checked}

    def format(self) -> str:
        head = (f"{self.url}: OK — {self.num_shards} shards, {self.num_samples} samples, "
                f"{self.num_tokens} tokens, {self.bytes_checked} bytes checksummed" if self.ok
                else f"{self.url}: {len(self.problems)} problem(s)")
        lines = [head] + [f"  problem: {p}" for p in self.problems] + [f"  note: {n}" for n in self.notes]
        return "\n".join(printable(line) for line in lines)  # one line per problem, whatever the store holds


def validate_store(url: str, storage_options: dict | None = None, *, check_values: bool = True,
                   max_problems: int = 200, progress: bool = False) -> ValidationReport:
    """Check everything about the store at ``url``; never raises for a damaged store.

    Args:
        check_values: decode every chunk and check values (otherwise structure + checksums).
        max_problems: stop after this many problems.
        progress: show a tqdm bar over shards (the CLI turns it on).

    Raises:
        StoreNotFoundError: there is no store at ``url`` (no such path, a file, no manifest.json).
    """
    report = ValidationReport(url=url)
    fs = StoreFS(url, storage_options=storage_options, read_only=True)
    try:
        manifest = read_manifest(fs)
    except StoreNotFoundError:
        raise
    except OspreyError as exc:
        report.problems.append(Problem(None, None, str(exc)))
        return report
    header = manifest.header
    report.num_shards, report.num_samples, report.num_tokens = (
        len(manifest.shards), manifest.num_samples, manifest.num_tokens)
    seen: dict[str, str] = {}
    listed = {s.shard_id for s in manifest.shards}
    for info in tqdm(manifest.shards, desc="validate", unit="shard", disable=not progress):
        if len(report.problems) >= max_problems:
            report.notes.append(f"stopped after {max_problems} problems")
            break
        try:
            _check_shard(fs, header, info, report, seen, check_values=check_values)
        except OspreyError as exc:
            report.problems.append(Problem(info.shard_id, None, str(exc)))
    for name in fs.listdir("shards"):
        if name.startswith(".tmp-"):
            report.notes.append(f"shards/{name}: unfinished shard of a running or crashed writer (ignored)")
        elif name not in listed:
            report.notes.append(f"shards/{name}: not in manifest.json (unmerged worker shard? run "
                                "`osprey data merge`) — invisible to readers")
    return report


def _check_shard(fs: StoreFS, header, info, report: ValidationReport, seen: dict[str, str], *,
                 check_values: bool) -> None:
    sid = info.shard_id
    h = ShardHandle(fs, header, info)
    # 1. the files the commit record lists are exactly the shard's files; each against its size
    # and CRC32C (chunks are verified while decoding in step 3 when values are checked, so that
    # they are read once)
    reader0 = h.reader("topk_ids")
    n_before = len(report.problems)
    arrays = stored_arrays(header)
    for name in sorted(set(h.commit["arrays"]) - set(arrays)):
        report.problems.append(Problem(sid, None, f"commit record lists array {name!r}, which a store of this "
                                                  "header does not have"))
    chunk_files: set[str] = set()
    expected = {TABLE_FILE, f"{ZARR_DIR}/zarr.json"}
    for name in arrays:
        meta_file, chunks = array_files(f"{ZARR_DIR}/{name}", h.commit["arrays"][name])
        expected.add(meta_file)
        expected.update(chunks)
        chunk_files.update(chunks)
    listed = set(h.commit["files"])
    for rel in sorted(expected - listed):
        report.problems.append(Problem(sid, None, f"commit record does not list {rel}"))
    for rel in sorted(listed - expected):
        report.problems.append(Problem(sid, None, f"commit record lists {rel}, which is no file of this shard"))
    for rel in sorted(listed):
        if check_values and rel in chunk_files:
            continue
        try:
            report.bytes_checked += len(reader0.read_verified(rel))
        except OspreyError as exc:
            report.problems.append(Problem(sid, None, str(exc)))
    if len(report.problems) > n_before:
        return  # values cannot be trusted past a checksum failure
    # 1b. Zarr metadata against the header: an external Zarr reader trusts zarr.json alone
    _check_zarr_metadata(h, header, report)
    if len(report.problems) > n_before:
        return
    # 2. table structure
    t = h.table()
    ids = t.column("sample_id").to_pylist()
    n_tok = np.asarray(t.column("num_tokens").to_numpy(), dtype=np.int64)
    offsets = np.asarray(t.column("row_offset").to_numpy(), dtype=np.int64)
    if info.num_tokens != int(n_tok.sum()) or h.commit["num_tokens"] != info.num_tokens:
        report.problems.append(Problem(sid, None, f"token count {int(n_tok.sum())} in table != "
                                       f"{info.num_tokens} in manifest"))
    expect = np.concatenate([[0], np.cumsum(n_tok)[:-1]])
    for j in np.nonzero(offsets != expect)[0][:5]:
        report.problems.append(Problem(sid, ids[j], f"row_offset {offsets[j]} != expected {expect[j]}"))
    vocab = header.target.vocab_size
    for j, (sample_id, toks, mask, plen) in enumerate(zip(
            ids, t.column("token_ids").to_pylist(), t.column("loss_mask").to_pylist(),
            t.column("prompt_length").to_pylist())):
        if sample_id in seen:
            report.problems.append(Problem(sid, sample_id, f"duplicate sample id (also in shard {seen[sample_id]})"))
        seen[sample_id] = sid
        if len(toks) != n_tok[j] or len(mask) != n_tok[j]:
            report.problems.append(Problem(sid, sample_id, f"token_ids/loss_mask length {len(toks)}/{len(mask)} "
                                           f"!= num_tokens {n_tok[j]}"))
        if not 0 <= plen <= n_tok[j]:
            report.problems.append(Problem(sid, sample_id, f"prompt_length {plen} outside [0, {n_tok[j]}]"))
        if toks and (min(toks) < 0 or max(toks) >= vocab):
            report.problems.append(Problem(sid, sample_id, f"token id outside [0, {vocab})"))
    if not check_values:
        return

    # 3. values, block by block, mapped back to samples
    def sample_at(row: int) -> str:
        return ids[int(np.searchsorted(offsets, row, side="right")) - 1]

    N = info.num_tokens
    hidden_parts = sorted(n for n in h.commit["arrays"] if n == "hidden" or n.startswith("hidden_"))
    block = max(h.reader(n).chunk_rows for n in hidden_parts)
    K = header.topk
    for a in range(0, N, block):
        b = min(N, a + block)
        try:
            arrays = {"hidden": h.decode_hidden("hidden", a, b, as_torch=False)}
            if header.has_final_hidden:
                arrays["final_hidden"] = h.decode_hidden("final_hidden", a, b, as_torch=False)
            tk_ids = h.reader("topk_ids").read_rows(a, b)
            tk_lp = h.reader("topk_logprobs").read_rows(a, b)
        except OspreyError as exc:
            report.problems.append(Problem(sid, sample_at(a), str(exc)))
            return
        for name, x in arrays.items():
            bad = ~np.isfinite(x.reshape(b - a, -1)).all(axis=1)
            for r in np.nonzero(bad)[0][:3]:
                report.problems.append(Problem(sid, sample_at(a + r), f"{name} has NaN/Inf at token row {a + r}"))
        bad_ids = ((tk_ids < 0) | (tk_ids >= vocab)).any(axis=1)
        for r in np.nonzero(bad_ids)[0][:3]:
            report.problems.append(Problem(sid, sample_at(a + r), f"topk_ids outside [0, {vocab}) at token row {a + r}"))
        bad_lp = ~np.isfinite(tk_lp).all(axis=1) | (tk_lp > 1e-4).any(axis=1)
        if K > 1:
            bad_lp |= (np.diff(tk_lp, axis=1) > 1e-6).any(axis=1)
        for r in np.nonzero(bad_lp)[0][:3]:
            report.problems.append(Problem(sid, sample_at(a + r), f"topk_logprobs not finite, positive or not "
                                           f"descending at token row {a + r}"))
    report.bytes_checked += sum(h.commit["files"][rel]["bytes"] for rel in chunk_files)


def _check_zarr_metadata(h: ShardHandle, header, report: ValidationReport) -> None:
    """Every ``zarr.json`` must say exactly what the writer wrote for this header and commit."""
    sid = h.info.shard_id
    reader0 = h.reader("topk_ids")
    wanted = {f"{ZARR_DIR}/zarr.json": group_metadata({"osprey_shard": sid})}
    for name in stored_arrays(header):
        meta = h.commit["arrays"][name]
        wanted[f"{ZARR_DIR}/{name}/zarr.json"] = array_metadata(
            meta["shape"], np.dtype(meta["dtype"]), meta["chunk_rows"], array_attributes(header, name),
            meta["compression"])
    for rel, want in wanted.items():
        try:
            doc = jsonio.loads(reader0.read_verified(rel))
        except OspreyError as exc:
            report.problems.append(Problem(sid, None, str(exc)))
            continue
        except ValueError as exc:  # not JSON (UnicodeDecodeError, JSONDecodeError)
            report.problems.append(Problem(sid, None, f"{rel} is not valid JSON ({exc})"))
            continue
        expected = jsonio.loads(want)
        if doc != expected:
            fields = sorted(k for k in set(doc) | set(expected) if doc.get(k) != expected.get(k)) \
                if isinstance(doc, dict) else ["(not an object)"]
            report.problems.append(Problem(sid, None, f"{rel} disagrees with the commit record and header in "
                                                      f"{', '.join(fields)}; Zarr readers would misread the array"))

"""``validate_store``: a full integrity check of a store, reporting every problem found.

Checks, in order: manifest (presence, JSON, format version, schema, totals); per listed shard:
commit record (presence, sha256 vs manifest, schema, header), every file's size and CRC32C,
array shapes/dtypes, table schema, row offsets, per-sample lengths, prompt lengths, token ids
in range, duplicate sample ids across shards; then the values: NaN/Inf in hidden states and
log-probs, top-k ids in range, log-probs <= 0 and sorted descending. Problems name the shard
and the sample. Unlisted shard folders (temp dirs of running or crashed writers, unmerged
shards) are reported as notes, not problems — readers never see them.

Legend: N rows of a shard, L taps, D hidden, K top-k.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from osprey_data.errors import OspreyError
from osprey_data.store.fs import StoreFS
from osprey_data.store.journal import read_manifest
from osprey_data.store.shard import ShardHandle
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
    """
    report = ValidationReport(url=url)
    fs = StoreFS(url, storage_options=storage_options, read_only=True)
    try:
        manifest = read_manifest(fs)
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
    # 1. every file against its size and CRC32C (chunks are verified while decoding in step 3
    # when values are checked, so they are read once)
    reader0 = h.reader("topk_ids")
    n_before = len(report.problems)
    for rel in sorted(h.commit["files"]):
        if check_values and "/c/" in rel:
            continue
        try:
            report.bytes_checked += len(reader0.read_verified(rel))
        except OspreyError as exc:
            report.problems.append(Problem(sid, None, str(exc)))
    if len(report.problems) > n_before:
        return  # values cannot be trusted past a checksum failure
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
    report.bytes_checked += sum(f["bytes"] for rel, f in h.commit["files"].items() if "/c/" in rel)

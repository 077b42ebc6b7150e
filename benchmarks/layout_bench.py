"""One real store in our layout and in our peers': bytes/token, write and read speed (issue 33).

The samples of a finished Osprey store (``--store``; the issue asks for Qwen2.5-Coder-0.5B stores)
are written, in one run, as:

- **ours, bf16-blosc** (the default codec) and **ours, fp8**: the same samples through
  ``StoreWriter``: taps, token ids, loss mask and the top-k teacher (ids + log-probs);
- **SpecForge-style**, **speculators-style** (bf16) and **speculators fp8** (per-token, per-row
  scales): one safetensors file per sample (:mod:`osprey_data.store.peer_layouts` says what each
  holds). The peers store the last layer's hidden state, from which their trainers recompute the
  target's logits; ours stores the top-k teacher instead. Where the store has no final hidden state
  the deepest tap stands in for its values: safetensors is not compressed, so no byte count
  changes.

Then every layout is read back, all samples, into bfloat16 torch tensors as a trainer holds them
(the fp8 layouts dequantized; every byte touched, as a copy to the GPU would, since safetensors
maps files lazily), from the warm page cache, in ``--repeats`` interleaved rounds; the
best round gives tokens/s. Ratios are to the SpecForge-style layout, measured in the same run.

    python benchmarks/layout_bench.py --store STORE [--repeats 5] [--out docs/results/layout-bench/NAME] [--quick]

Writes ``table.md`` and ``results.json`` under ``--out`` (when given) and ends with one ``RESULT``
line.

Legend: T tokens of a sample, L taps, D hidden size, N all tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from osprey_data.store import SampleRecord, StoreReader, StoreWriter
from osprey_data.store.peer_layouts import PEER_LAYOUTS, read_peer_sample, write_peer_sample

OURS = ("bf16-blosc", "fp8")


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_ours(url: Path, header, samples, codec: str) -> float:
    t0 = time.perf_counter()
    with StoreWriter(str(url), dataclasses.replace(header, hidden_codec=codec, has_final_hidden=False)) as w:
        for s in samples:
            w.add(SampleRecord(sample_id=s.sample_id, domain=s.domain, source=s.source, conversation=s.conversation,
                               token_ids=s.token_ids, loss_mask=s.loss_mask, prompt_length=s.prompt_length,
                               finish_reason=s.finish_reason, hidden_TLD=s.hidden_TLD, topk_ids_TK=s.topk_ids_TK,
                               topk_logprobs_TK=s.topk_logprobs_TK))
    return time.perf_counter() - t0


def write_peer(folder: Path, layout: str, samples) -> float:
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    for s in samples:
        last_TD = s.final_hidden_TD if s.final_hidden_TD is not None else s.hidden_TLD[:, -1]
        write_peer_sample(layout, folder / f"{s.sample_id}.safetensors", hidden_TLD=torch.as_tensor(s.hidden_TLD),
                          last_TD=torch.as_tensor(last_TD), token_ids=torch.as_tensor(s.token_ids),
                          loss_mask=torch.as_tensor(s.loss_mask))
    return time.perf_counter() - t0


def _touch(*tensors: torch.Tensor) -> int:
    """Reads every byte (a sum), as a copy to the GPU would: a memory-mapped tensor is not yet read."""
    for t in tensors:
        t.sum()
    return int(tensors[0].shape[0])


def read_ours(url: Path) -> int:
    return sum(_touch(s.hidden_TLD, s.topk_logprobs_TK, s.topk_ids_TK)
               for s in StoreReader(str(url)).iter_samples(as_torch=True))


def read_peer(folder: Path, layout: str) -> int:
    return sum(_touch(t["taps_TLD"], t["last_TD"]) for t in map(lambda f: read_peer_sample(layout, f),
                                                                  sorted(folder.iterdir())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="a finished Osprey store (folder or URL)")
    ap.add_argument("--repeats", type=int, default=5, help="read rounds, the layouts taking turns (best reported)")
    ap.add_argument("--max-samples", type=int, default=0, help="the first N samples only (0: all)")
    ap.add_argument("--out", default=None, help="folder for table.md and results.json")
    ap.add_argument("--quick", action="store_true", help="< 60 s: the first 16 samples, 2 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.max_samples = min(args.max_samples or 16, 16)
        args.repeats = min(args.repeats, 2)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    reader = StoreReader(args.store)
    header = reader.header
    samples = list(reader.iter_samples(as_torch=True))
    if args.max_samples:
        samples = samples[:args.max_samples]
    if not samples:
        print(f"error: store {args.store} has no samples to measure", file=sys.stderr)
        return 2
    N = sum(int(s.hidden_TLD.shape[0]) for s in samples)
    L, D = samples[0].hidden_TLD.shape[1:]
    print(f"store {args.store}: {header.target.name_or_path}, {len(samples)} samples, {N} tokens, L={L} taps, "
          f"D={D}, top-{header.topk}, final hidden stored: {header.has_final_hidden}; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    work = Path(tempfile.mkdtemp(prefix="layout_bench_"))
    try:
        write_s, paths, readers = {}, {}, {}
        for layout in PEER_LAYOUTS:
            paths[layout] = work / layout
            write_s[layout] = write_peer(paths[layout], layout, samples)
            readers[layout] = (lambda p=paths[layout], lay=layout: read_peer(p, lay))
        for codec in OURS:
            name = f"ours {codec}"
            paths[name] = work / codec
            write_s[name] = write_ours(paths[name], header, samples, codec)
            readers[name] = (lambda p=paths[name]: read_ours(p))
        read_s: dict[str, list[float]] = {k: [] for k in readers}
        for _ in range(args.repeats):
            for name, fn in readers.items():
                t0 = time.perf_counter()
                assert fn() == N, name
                read_s[name].append(time.perf_counter() - t0)
        rows = {}
        base = "specforge"
        base_bytes, base_read = folder_bytes(paths[base]), min(read_s[base])
        for name in paths:
            nbytes, best = folder_bytes(paths[name]), min(read_s[name])
            rows[name] = {"bytes_per_token": round(nbytes / N), "size_vs_specforge": round(nbytes / base_bytes, 3),
                          "write_tokens_per_s": round(N / write_s[name]), "read_tokens_per_s": round(N / best),
                          "read_vs_specforge": round(base_read / best, 3),
                          "read_median_s": round(float(np.median(read_s[name])), 4)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"Store: `{args.store}` ({header.target.name_or_path}; {len(samples)} samples, {N:,} tokens, "
             f"{L} taps of D = {D}, top-{header.topk} teacher in ours). Read: all samples into bfloat16 torch "
             f"tensors, warm page cache, best of {args.repeats} interleaved rounds.", "",
             "| layout | bytes/token | size vs SpecForge-style | write tokens/s | read tokens/s | read vs SpecForge-style |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['bytes_per_token']:,} | {r['size_vs_specforge']:.3f}x | "
                     f"{r['write_tokens_per_s']:,} | {r['read_tokens_per_s']:,} | {r['read_vs_specforge']:.3f}x |")
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        doc = {"store": str(args.store), "target": header.target.name_or_path, "samples": len(samples), "tokens": N,
               "taps": int(L), "hidden": int(D), "topk": int(header.topk), "repeats": args.repeats,
               "load_avg": round(os.getloadavg()[0], 1), "layouts": rows}
        (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    key = {"ours bf16-blosc": "ours_bf16", "ours fp8": "ours_fp8", "speculators": "speculators_bf16",
           "speculators-fp8": "speculators_fp8"}
    res = {"tokens": N, "hidden": int(D), "specforge_Bpt": rows["specforge"]["bytes_per_token"]}
    for name, k in key.items():
        res[f"{k}_size_ratio"] = rows[name]["size_vs_specforge"]
        res[f"{k}_read_ratio"] = rows[name]["read_vs_specforge"]
    res["ours_bf16_read_tokens_per_s"] = rows["ours bf16-blosc"]["read_tokens_per_s"]
    print("RESULT " + " ".join(f"{k}={v}" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

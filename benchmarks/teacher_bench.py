"""How much of the target's distribution the stored top-k keeps, per k, domain and response position.

For every response position of a store's samples, the target is run again on the stored tokens
(float32, transformers) and its full next-token distribution compared with its top-k for each
``--ks`` (:mod:`osprey_train.evaluation.teacher_fidelity`): the probability mass the top-k covers,
the KL of the renormalised top-k from the full distribution (``-log mass``), the entropy of what
the tail bucket lumps together, and the share of positions where the top-k covers under 90 %.
Side by side in one run: each k against the full distribution (k = vocabulary), per domain and
per response-position bucket. As an integrity check, the recomputed top-1 is compared with the
store's own stored top-1 (the fraction that agrees; near-ties between kernels may differ).

It does not train drafters: the held-out AL of drafters distilled with each k (the other half of
issue 33's question) is a study, not a benchmark.

    python benchmarks/teacher_bench.py --store STORE [--target DIR] [--ks 8,16,32,64,128] \
        [--max-samples N] [--out docs/results/teacher-bench/NAME] [--quick]

Writes ``table.md`` and ``results.json`` under ``--out`` and ends with one ``RESULT`` line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from osprey_data.store import StoreReader
from osprey_data.target_model import load_hf_target
from osprey_train.evaluation.teacher_fidelity import POSITION_BUCKETS, TopkFidelity, topk_fidelity


def bucket_name(lo: int, hi: int | None) -> str:
    return f"pos {lo}+" if hi is None else f"pos {lo}-{hi - 1}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--target", default=None, help="target folder (default: the one the store names)")
    ap.add_argument("--ks", default="8,16,32,64,128")
    ap.add_argument("--max-samples", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="folder for table.md and results.json")
    ap.add_argument("--quick", action="store_true", help="< 60 s: 4 samples, k = 8 and 64")
    args = ap.parse_args(argv)
    if args.quick:
        args.max_samples, args.ks = 4, "8,64"
    if args.threads:
        torch.set_num_threads(args.threads)
    ks = tuple(sorted({int(k) for k in args.ks.split(",")}))
    reader = StoreReader(args.store)
    header = reader.header
    target_path = args.target or header.target.name_or_path
    model, _ = load_hf_target(target_path, dtype=torch.float32)
    vocab = int(header.target.vocab_size)
    all_ks = ks + (vocab,)
    fid = TopkFidelity(ks=all_ks)
    agree = compared = 0
    n = len(reader) if not args.max_samples else min(args.max_samples, len(reader))
    t0 = time.perf_counter()
    for i in range(n):
        s = reader.sample(i, as_torch=True)
        ids = s.token_ids.long()
        with torch.no_grad():
            logits_TV = model(ids[None]).logits[0, :, :vocab].float()
        # row t is the distribution of token t + 1: the rows that predict response tokens
        predicts_T = torch.zeros(ids.shape[0], dtype=torch.bool)
        predicts_T[:-1] = s.loss_mask.bool()[1:]
        rows = predicts_T.nonzero().flatten()
        if rows.numel() == 0:
            continue
        figures = topk_fidelity(logits_TV[rows], all_ks)
        agree += int((logits_TV[rows].argmax(-1) == s.topk_ids_TK[rows, 0].long()).sum())
        compared += int(rows.numel())
        position_R = rows + 1 - s.prompt_length
        everywhere = torch.ones(rows.numel(), dtype=torch.bool)
        fid.add(["all", f"domain {s.domain}"], figures, everywhere)
        for lo, hi in POSITION_BUCKETS:
            inside = (position_R >= lo) & (position_R < hi if hi is not None else True)
            fid.add([bucket_name(lo, hi)], figures, inside)
        print(f"\rsample {i + 1}/{n}", end="", file=sys.stderr)
    print(file=sys.stderr)
    wall = time.perf_counter() - t0

    groups = ["all"] + sorted(g for g in fid.counts if g.startswith("domain ")) + \
        [bucket_name(lo, hi) for lo, hi in POSITION_BUCKETS if bucket_name(lo, hi) in fid.counts]
    lines = [f"# Top-k teacher fidelity: {header.target.name_or_path}", "",
             f"Store `{args.store}` ({n} samples, {fid.counts.get('all', 0)} response positions, top-k stored: "
             f"{header.topk}); target recomputed in float32; stored top-1 = recomputed top-1 at "
             f"{agree / max(compared, 1):.4f} of positions. k = {vocab} is the full distribution.", "",
             "| group | k | mass covered | KL(renorm top-k \\|\\| full) | tail entropy (nats) | positions with mass < 0.9 |",
             "|---|---:|---:|---:|---:|---:|"]
    doc = {"store": args.store, "target": header.target.name_or_path, "samples": n, "stored_topk": header.topk,
           "top1_agreement": agree / max(compared, 1), "groups": {}}
    for g in groups:
        table = fid.table(g)
        doc["groups"][g] = {str(k): v for k, v in table.items()}
        for k in all_ks:
            r = table[k]
            lines.append(f"| {g} | {k} | {r['mass']:.4f} | {r['kl_renorm']:.4f} | {r['tail_entropy']:.3f} | "
                         f"{r['low_mass_share']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(text, encoding="utf-8")
        (out / "results.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    summary = fid.table("all")
    fields = " ".join(f"mass_k{k}={summary[k]['mass']:.4f}" for k in ks)
    fields += " " + " ".join(f"kl_k{k}={summary[k]['kl_renorm']:.4f}" for k in ks)
    print(f"RESULT target={Path(header.target.name_or_path).name} positions={fid.counts.get('all', 0)} {fields} "
          f"top1_agreement={agree / max(compared, 1):.4f} wall_s={wall:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

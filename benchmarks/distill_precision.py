"""Does bf16 autocast distill as well as float32? The same drafter distilled in both precisions,
a few seeds each, runs interleaved; held-out acceptance length and training tokens/s.

Target SmolLM2-135M-Instruct (demo cache); drafter: the target pruned to 2 blocks and converted
with ``--draft-vocab`` (``live_bench``'s drafter build, cached in ``$OSPREY_CACHE/live-bench``:
its ``init`` and training ``store``); a held-out store of ``--eval-prompts`` demo prompts not in
the training store is built here once (float32 target). Each run starts from the same converted
drafter; only the seed (data order) and the training precision differ. The claim checked: the
bf16-autocast acceptance lies within the float32 runs' seed spread (``|mean difference| <=
max(2 x seed std, 0.02)``). No ``--quick`` mode: acceptance of a drafter trained under a minute
says nothing; the default run is ~4 x 30 steps (minutes).

Usage::

    python benchmarks/distill_precision.py --drafter-root ~/.cache/osprey/live-bench/drafter-XXXX

Ends with one ``RESULT key=value ...`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter-root", required=True, help="a live_bench drafter folder (holds init/ and store/)")
    ap.add_argument("--target", default=None, help="target HF folder (default: SmolLM2 from the demo cache)")
    ap.add_argument("--precisions", default="float32,bf16-autocast")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tokens-per-batch", type=int, default=256)
    ap.add_argument("--eval-prompts", type=int, default=16)
    ap.add_argument("--eval-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/distill_precision")
    args = ap.parse_args()

    import torch

    from osprey_data.builder import BuildConfig
    from osprey_data.builder.runner import run as build
    from osprey_train.demo.fetch import fetch_smollm2
    from osprey_train.demo.pipeline import shipped_prompts, split_prompts
    from osprey_train.stages.defaults import distill_optim
    from osprey_train.stages.distill import DistillConfig
    from osprey_train.stages.distill import run as distill
    from osprey_train.trainer import LoopConfig

    torch.set_num_threads(args.threads)
    root, out = Path(args.drafter_root).expanduser(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = Path(args.target) if args.target else fetch_smollm2()
    eval_store = root / f"eval-store-{args.eval_prompts}x{args.eval_tokens}"
    if not (eval_store / "manifest.json").is_file():
        # live_bench's training store holds the first 64 of the split; the held-out ones are disjoint
        records = split_prompts(shipped_prompts(), 64, args.eval_prompts)[1]
        path = out / "eval_prompts.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        print(f"building the held-out store ({args.eval_prompts} prompts x {args.eval_tokens} tokens) ...", flush=True)
        build(BuildConfig(inputs=(str(path),), out=str(eval_store), target=str(target), regenerate=True,
                          max_new_tokens=args.eval_tokens, temperature=0.0, topk=32, batch_size=8, device="cpu",
                          dtype="float32", progress=False, overwrite=True))
    names = [n.strip() for n in args.precisions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    rows: dict[str, list[dict]] = {n: [] for n in names}
    for i, seed in enumerate(seeds):
        for n in (names if i % 2 == 0 else names[::-1]):  # interleaved: drift hits both alike
            run_dir = out / f"{n}-seed{seed}"
            loop = LoopConfig(out_dir=run_dir, max_steps=args.steps, device="cpu", seed=seed, progress=False,
                              distributed="none", log_every=max(1, args.steps // 5), precision=n, plot=False,
                              keep_checkpoints=1)
            t0 = time.perf_counter()
            res = distill(DistillConfig(drafter=root / "init", store=str(root / "store"), eval_store=str(eval_store),
                                        loop=loop, optim=distill_optim(lr=5e-4, warmup_ratio=0.1), ttt_steps=3,
                                        tokens_per_batch=args.tokens_per_batch, eval_samples=args.eval_prompts))
            rows[n].append({"seed": seed, "accept_len": res.last_eval["accept_len"], "tokens_per_s": res.tokens_per_s,
                            "loss": res.last_train["loss"], "precision": res.precision,
                            "seconds": time.perf_counter() - t0})
            print(f"{n} seed {seed}: held-out AL {res.last_eval['accept_len']:.4f}, loss {res.last_train['loss']:.4f}, "
                  f"{res.tokens_per_s:.0f} tok/s (recorded precision {res.precision})", flush=True)
    base = rows[names[0]]
    mean0 = statistics.mean(r["accept_len"] for r in base)
    std0 = statistics.stdev(r["accept_len"] for r in base) if len(base) > 1 else 0.0
    result: dict[str, object] = {"steps": args.steps, "seeds": len(seeds), "fp32_al": round(mean0, 4),
                                 "fp32_al_seed_std": round(std0, 4)}
    for n in names[1:]:
        mean = statistics.mean(r["accept_len"] for r in rows[n])
        speed = statistics.median(r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rows[n], base))
        key = "autocast" if n == "bf16-autocast" else n
        result[f"{key}_al"] = round(mean, 4)
        result[f"{key}_al_diff"] = round(mean - mean0, 4)
        result[f"{key}_within_noise"] = abs(mean - mean0) <= max(2 * std0, 0.02)
        result[f"{key}_tok_s_vs_fp32"] = round(speed, 3)
    result["load_avg"] = round(os.getloadavg()[0], 1)
    (out / "distill_precision.json").write_text(json.dumps({"runs": rows, "result": result}, indent=2))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()

"""Where a distill step's time goes, per training precision: one real TTT step (forward, backward,
AdamW) of a SmolLM2 drafter, float32 against bf16 autocast, timed interleaved and profiled.

The drafter and the store are ``live_bench``'s (``--drafter-root``: its ``init/`` and ``store/``,
built by ``benchmarks/live_bench.py`` and cached in ``$OSPREY_CACHE/live-bench``); the step is the
trainer's own (``DistillTask``'s model and packed batches, ``build_optimizer``, gradient
clipping), without the loop around it. Sections:

1. **timing**: ``--repeats`` rounds; each round runs one step per precision on the same batch,
   the order alternating, and times its phases (forward, backward, optimizer incl. clipping)
   separately. Medians per phase; the ratio float32 / bf16-autocast is the speedup. The trainer's
   AdamW is fused; ``--compare-foreach`` also times both precisions with the unfused one.
2. **profile**: one more step per precision under ``torch.profiler`` (CPU); the self time of the
   top ops, and the shares of op families: matmuls (``mm``/``addmm``/``bmm``/``linear``), casts
   (``to``/``copy_``: what autocast adds), attention (``scaled_dot_product*``), softmax / loss,
   the optimizer (``_foreach_*``, ``add_``, ...), and everything else (elementwise: RMSNorm,
   RoPE, SiLU, masks).

With ``--quick`` (< 60 s) a tiny random drafter and store are built on the fly instead
(``tests/helpers/tiny_store.py``), which checks the script, not the figures. Ends with one
``RESULT key=value ...`` line.

Usage::

    python benchmarks/distill_profile.py --drafter-root ~/.cache/osprey/live-bench/drafter-XXXX
    python benchmarks/distill_profile.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PRECISIONS = ("float32", "bf16-autocast")
PHASES = ("forward", "backward", "optimizer")
FAMILIES = {  # first match wins; op names are aten's
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
               "mkldnn", "aten::_mm"),
    "cast": ("aten::to", "aten::_to_copy", "aten::copy_", "aten::_autocast"),
    "attention": ("scaled_dot_product", "aten::_flash", "aten::_efficient"),
    "softmax/loss": ("softmax", "log_softmax", "aten::nll", "aten::cross_entropy", "aten::logsumexp",
                     "aten::gather", "aten::scatter"),
    "optimizer": ("_foreach", "aten::addcmul_", "aten::addcdiv_", "aten::lerp_", "aten::sqrt", "aten::norm",
                  "aten::linalg_vector_norm", "aten::clamp"),
}


def family(op: str) -> str:
    for name, keys in FAMILIES.items():
        if any(k in op for k in keys):
            return name
    return "other"


def tiny_root(work: Path) -> tuple[Path, Path]:
    """A tiny random target pruned to 2 blocks and converted (``init/``) with a tiny ``store/``."""
    from osprey_train.stages.convert import ConvertConfig
    from osprey_train.stages.convert import run as convert
    from osprey_train.stages.prune import PruneConfig
    from osprey_train.stages.prune import run as prune
    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer
    from tests.helpers.tiny_store import make_tiny_store

    tok = make_tiny_tokenizer(work / "tok", vocab_size=512)
    target = make_tiny_llama(work / "target", tok, num_layers=4, hidden_size=128)
    store = make_tiny_store(work / "store", target, num_samples=16, max_new_tokens=24)
    prune(PruneConfig(source=str(target), layers=2, out=work / "backbone"))
    convert(ConvertConfig(backbone=work / "backbone", target=str(target), store=str(store), out=work / "init"))
    return work, Path(store)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter-root", default=None, help="a live_bench drafter folder (holds init/ and store/)")
    ap.add_argument("--quick", action="store_true", help="< 60 s: a tiny random drafter and store")
    ap.add_argument("--tokens-per-batch", type=int, default=256, help="packed tokens per step (distill_precision's)")
    ap.add_argument("--ttt-steps", type=int, default=3, help="TTT steps K (distill_precision's)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 8; quick 3)")
    ap.add_argument("--top", type=int, default=12, help="ops listed per precision")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compare-foreach", action="store_true",
                    help="also time each precision with the unfused (foreach) AdamW, the trainer's optimizer before "
                         "fused AdamW became its default")
    ap.add_argument("--out", default="runs/distill_profile", help="folder for distill_profile.json / .md")
    args = ap.parse_args()
    if not args.quick and not args.drafter_root:
        ap.error("--drafter-root is required (or --quick)")
    repeats = args.repeats or (3 if args.quick else 8)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from osprey_data.target_model import resolve_precision
    from osprey_train.stages.defaults import distill_optim
    from osprey_train.stages.distill import DistillConfig, DistillTask
    from osprey_train.trainer import LoopConfig
    from osprey_train.trainer.optim import build_optimizer

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="distill-profile-"))
    if args.quick:
        root, store = tiny_root(tmp / "tiny")
    else:
        root = Path(args.drafter_root).expanduser()
        store = root / "store"
    optim = distill_optim(lr=5e-4, warmup_ratio=0.1)
    cfg = DistillConfig(drafter=root / "init", store=str(store), optim=optim, ttt_steps=args.ttt_steps,
                        tokens_per_batch=args.tokens_per_batch, prefetch=0,
                        loop=LoopConfig(out_dir=tmp / "run", max_steps=repeats + 4, device="cpu", seed=0,
                                        progress=False, distributed="none"))
    task = DistillTask(cfg)
    precs = {n: resolve_precision(n, "cpu", training=True) for n in PRECISIONS}
    contenders = list(PRECISIONS) + ([f"{n}+foreach" for n in PRECISIONS] if args.compare_foreach else [])
    runs = {}
    for n in contenders:
        torch.manual_seed(0)
        model = task.build_model()
        params = task.trainable_parameters(model)
        opt = build_optimizer(model, params, optim)
        if n.endswith("+foreach"):  # the same groups and settings, unfused
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups]
            opt = torch.optim.AdamW(groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                                    weight_decay=optim.weight_decay, foreach=True)
            assert not opt.param_groups[0]["fused"]
        runs[n] = (model, params, opt)
    precs.update({f"{n}+foreach": precs[n] for n in PRECISIONS})
    batches = [task.batch(i, 0, 0, 1) for i in range(repeats + 2)]
    tokens = int(batches[0].input_ids_BT.numel())

    def step(n: str, batch) -> dict[str, float]:
        model, params, opt = runs[n]
        t0 = time.perf_counter()
        with precs[n].context():
            loss, _ = model(batch)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, optim.grad_clip or 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "step": t3 - t0}

    for n in contenders:  # warm-up: the optimizer state, oneDNN's kernels
        step(n, batches[0])
    samples: dict[str, list[dict]] = {n: [] for n in contenders}
    for r in range(repeats):
        for n in (contenders if r % 2 == 0 else contenders[::-1]):
            samples[n].append(step(n, batches[1 + r]))
    timing = {n: {k: statistics.median(s[k] for s in samples[n]) for k in (*PHASES, "step")} for n in contenders}
    base = timing[PRECISIONS[0]]
    ratio = {k: base[k] / timing["bf16-autocast"][k] for k in (*PHASES, "step")}
    print(f"{tokens} tokens per step, K={args.ttt_steps}, {args.threads} thread(s), {repeats} interleaved rounds")
    for n in contenders:
        t = timing[n]
        print(f"[{n}] step {t['step'] * 1e3:.0f} ms = forward {t['forward'] * 1e3:.0f} + backward "
              f"{t['backward'] * 1e3:.0f} + optimizer {t['optimizer'] * 1e3:.0f} ms; {tokens / t['step']:.0f} tok/s")
    print("bf16-autocast speedup: " + ", ".join(f"{k} x{v:.2f}" for k, v in ratio.items()))
    foreach = {}
    if args.compare_foreach:
        old = timing["float32+foreach"]["step"]
        foreach = {"fp32_foreach_step_ms": round(old * 1e3, 1),
                   "autocast_foreach_step_ms": round(timing["bf16-autocast+foreach"]["step"] * 1e3, 1),
                   "speedup_fused_fp32": round(old / base["step"], 3),
                   "speedup_autocast_fused_vs_fp32_foreach": round(old / timing["bf16-autocast"]["step"], 3)}
        print(f"fused AdamW: float32 step x{foreach['speedup_fused_fp32']:.2f} of foreach; bf16-autocast + fused "
              f"x{foreach['speedup_autocast_fused_vs_fp32_foreach']:.2f} of float32 + foreach")

    profiles = {}
    for n in PRECISIONS:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(n, batches[-1])
        events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
        total = sum(e.self_cpu_time_total for e in events)
        shares: dict[str, float] = {}
        for e in events:
            shares[family(e.key)] = shares.get(family(e.key), 0.0) + e.self_cpu_time_total / total
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]
        profiles[n] = {"total_ms": total / 1e3, "shares": dict(sorted(shares.items(), key=lambda kv: -kv[1])),
                       "top": [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "calls": e.count,
                                "share": e.self_cpu_time_total / total} for e in top]}
        print(f"[{n}] profiled self time {total / 1e3:.0f} ms; families: "
              + ", ".join(f"{k} {v:.0%}" for k, v in profiles[n]["shares"].items()))
        for row in profiles[n]["top"]:
            print(f"    {row['op']:<44} {row['self_ms']:8.1f} ms {row['calls']:6d} calls {row['share']:6.1%}")
    # per family: milliseconds in each precision and what the family saves or costs
    fam = sorted({k for p in profiles.values() for k in p["shares"]})
    by_family = {k: {n: profiles[n]["shares"].get(k, 0.0) * profiles[n]["total_ms"] for n in PRECISIONS} for k in fam}
    load = round(os.getloadavg()[0], 1)
    doc = {"contenders": contenders, "tokens_per_step": tokens, "ttt_steps": args.ttt_steps, "threads": args.threads, "repeats": repeats,
           "load_avg": load, "drafter_root": str(root), "timing": timing, "speedup": ratio,
           "profiles": profiles, "family_ms": by_family}
    (out / "distill_profile.json").write_text(json.dumps(doc, indent=2))
    lines = ["| op family | float32 ms | bf16-autocast ms | float32 / autocast |", "|---|---:|---:|---:|"]
    for k, v in sorted(by_family.items(), key=lambda kv: -kv[1][PRECISIONS[0]]):
        a, b = v[PRECISIONS[0]], v["bf16-autocast"]
        lines.append(f"| {k} | {a:.1f} | {b:.1f} | {a / b if b else float('inf'):.2f} |")
    (out / "distill_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    result = {"tokens_per_step": tokens, "threads": args.threads, "load_avg": load,
              **{f"fp32_{k}_ms": round(base[k] * 1e3, 1) for k in (*PHASES, "step")},
              **{f"autocast_{k}_ms": round(timing['bf16-autocast'][k] * 1e3, 1) for k in (*PHASES, "step")},
              **{f"speedup_{k}": round(v, 3) for k, v in ratio.items()}, **foreach,
              **{f"fp32_share_{k.replace('/', '_')}": round(profiles['float32']['shares'].get(k, 0.0), 3) for k in fam},
              **{f"autocast_share_{k.replace('/', '_')}": round(profiles['bf16-autocast']['shares'].get(k, 0.0), 3)
                 for k in fam}}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()

"""Throughput section of ``distill_bench.py``: distillation tokens/s from a store vs from memory.

Three contenders run the real trainer (:func:`osprey_train.stages.distill.run`) on the same
drafter, the same store and the same packed micro-batches, taking turns:

* ``memory``   — every micro-batch packed before the run and handed over from a list;
* ``store``    — read and packed from the store during the run, prefetched (the default);
* ``no_prefetch`` — read and packed from the store on demand (``prefetch=0``).

Rates: tokens between the start of step 1 and the start of the last step, divided by that time
(step 0 allocates the optimizer state; after the last step the trainer writes its checkpoint).
Also reported: the share of that time the training loop spent waiting for its next batch — an
upper bound on what the data path costs the run that, unlike tokens/s, does not swing with the
load other processes put on the machine (it cannot see CPU the prefetch thread takes from the
step when cores are scarce; on a GPU the step does not compete for them).

Legend: T tokens, L taps, Dt target hidden, K top-k.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_HIDDEN = 4096   # an 8B-class target: 3 x 4096 bf16 = 24 KiB of taps per token
TOPK = 64
# A small drafter, so that a CPU step is as short relative to the data as a GPU step of the real
# shape is (GPU: ~0.1-0.3 s per 4k-token step against ~100 MB of taps to read and pack).
DRAFTER = dict(d=64, intermediate=128, heads=1, kv_heads=1, head_dim=64, vocab=2048, layers=1, taps=3,
               d_target=TARGET_HIDDEN)


def _write_store(url: Path, vocab: int, n_tokens: int, seed: int = 0) -> None:
    import torch

    from osprey_data.store import SampleRecord, StoreHeader, StoreWriter, TapLayers, TargetIdentity

    tgt = TargetIdentity(name_or_path="synthetic-8b", model_type="llama", config_hash="bench",
                         tokenizer_hash="bench", vocab_size=vocab, hidden_size=TARGET_HIDDEN, num_layers=36,
                         dtype="bfloat16")
    hdr = StoreHeader(target=tgt, taps=TapLayers(layer_ids=(2, 18, 33)), topk=TOPK, hidden_codec="bf16-blosc",
                      has_final_hidden=False, chat_template_hash="", generation={}, build_fingerprint="bench",
                      build_config={}, builder_version="bench")
    rng = np.random.default_rng(seed)
    left, i = n_tokens, 0
    with StoreWriter(str(url), hdr, shard_max_tokens=1 << 16) as w:
        while left > 0:
            T = int(min(left, rng.integers(64, 1025)))
            scale_D = np.exp(rng.normal(0, 0.5, TARGET_HIDDEN)).astype(np.float32)
            hidden_TLD = torch.from_numpy(rng.standard_normal((T, 3, TARGET_HIDDEN), dtype=np.float32) * scale_D)
            lp_TK = -np.sort(rng.random((T, TOPK), dtype=np.float32) * 8, axis=1)
            w.add(SampleRecord(
                sample_id=f"s{i:05d}", domain="bench", source="bench", conversation=[],
                token_ids=rng.integers(0, vocab, T).astype(np.int32), loss_mask=rng.random(T) > 0.3,
                prompt_length=0, finish_reason="stop", hidden_TLD=hidden_TLD.to(torch.bfloat16),
                topk_ids_TK=rng.integers(0, vocab, (T, TOPK)).astype(np.int32), topk_logprobs_TK=lp_TK))
            left -= T
            i += 1


def _write_drafter(out: Path, build, sh: dict) -> Path:
    from osprey_train.models import save_drafter

    model = build(sh)
    save_drafter(model, out)
    return out


def _one_run(kind: str, drafter: Path, store: Path, out: Path, args, batches: dict | None) -> tuple[float, float]:
    """(tokens/s, fraction of the time the step waited for its batch) of one distill run,
    between the starts of step 1 and of the last step."""
    import osprey_train.stages.distill as distill

    stamps: list[float] = []
    tokens: list[int] = []
    waits: list[float] = []

    class Task(distill.DistillTask):
        def batch(self, step, micro, rank, world_size):
            stamps.append(time.perf_counter())
            b = batches[step] if batches is not None else super().batch(step, micro, rank, world_size)
            waits.append(time.perf_counter() - stamps[-1])
            tokens.append(b.num_tokens)
            return b

    from osprey_train.trainer import LoopConfig
    from osprey_train.trainer.loop import train

    loop = LoopConfig(out_dir=out, max_steps=args.tp_steps, device="cpu", distributed="none", progress=False,
                      log_every=10_000, plot=False, keep_checkpoints=1)
    cfg = distill.DistillConfig(drafter=drafter, store=str(store), loop=loop, tokens_per_batch=args.tp_tokens,
                                ttt_steps=5, attention="sdpa", target_dist="renorm",
                                prefetch=0 if kind == "no_prefetch" else 2)
    train(Task(cfg), loop, cfg.optim)
    span = stamps[-1] - stamps[1]
    return sum(tokens[1:-1]) / span, sum(waits[1:-1]) / span


def throughput_section(args, build) -> dict:
    import torch

    from osprey_data.store import StoreReader
    from osprey_train.distill_data.packing import StorePacker

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    sh = DRAFTER
    with tempfile.TemporaryDirectory(prefix="distill_tp_") as tmp:
        tmp = Path(tmp)
        n_tokens = args.tp_tokens * (args.tp_steps + 2)  # an epoch longer than a run: no repeats
        t0 = time.perf_counter()
        _write_store(tmp / "store", sh["vocab"], n_tokens)
        drafter = _write_drafter(tmp / "drafter", build, sh)
        packer = StorePacker(StoreReader(str(tmp / "store")), args.tp_tokens, seed=0)
        batches = {i: packer.batch(i) for i in range(args.tp_steps)}
        mb = sum(b.taps_BTLDt.numel() * 2 for b in batches.values()) / len(batches) / 1e6
        print(f"\nthroughput: store of {n_tokens} tokens (d_target {TARGET_HIDDEN}, 3 taps, bf16-blosc) written in "
              f"{time.perf_counter() - t0:.1f} s; {args.tp_steps} steps x {args.tp_tokens} tokens "
              f"({mb:.0f} MB of taps per micro-batch), drafter d={sh['d']} vocab={sh['vocab']}, "
              f"{torch.get_num_threads()} torch thread(s); load average {os.getloadavg()[0]:.1f}")
        rates: dict[str, list[float]] = {"memory": [], "store": [], "no_prefetch": []}
        waits: dict[str, list[float]] = {k: [] for k in rates}
        for r in range(args.tp_repeats):
            for kind in rates:
                rate, wait = _one_run(kind, drafter, tmp / "store", tmp / f"run-{kind}-{r}", args,
                                      batches if kind == "memory" else None)
                rates[kind].append(rate)
                waits[kind].append(wait)
            print(f"  round {r + 1}: " + ", ".join(f"{k} {rates[k][-1]:.0f} tok/s (waits {100 * waits[k][-1]:.1f} %)"
                                                 for k in rates), flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    wait = {k: statistics.median(v) for k, v in waits.items()}
    # per-round ratios: the contenders of one round ran back to back, under the same load
    ratio = statistics.median(s / m for s, m in zip(rates["store"], rates["memory"]))
    ratio_np = statistics.median(s / m for s, m in zip(rates["no_prefetch"], rates["memory"]))
    print(f"{'source':<34}{'tokens/s':>10}{'vs memory':>11}{'step waits for data':>22}")
    print(f"{'packed batches in memory':<34}{med['memory']:>10.0f}{1.0:>10.3f}x{100 * wait['memory']:>20.1f} %")
    print(f"{'store, prefetch 2 (default)':<34}{med['store']:>10.0f}{ratio:>10.3f}x{100 * wait['store']:>20.1f} %")
    print(f"{'store, no prefetch':<34}{med['no_prefetch']:>10.0f}{ratio_np:>10.3f}x{100 * wait['no_prefetch']:>20.1f} %")
    print(f"store vs memory: {100 * (1 - ratio):+.1f} % slower (goal <= 5 %); the time the training loop waited "
          f"for batches bounds what the store can cost, independently of other load on the machine")
    return {"tp_memory_tok_s": round(med["memory"]), "tp_store_tok_s": round(med["store"]),
            "tp_store_vs_memory": round(ratio, 3), "tp_no_prefetch_vs_memory": round(ratio_np, 3),
            "tp_slowdown_pct": round(100 * (1 - ratio), 1), "tp_wait_pct": round(100 * wait["store"], 2),
            "tp_no_prefetch_wait_pct": round(100 * wait["no_prefetch"], 2), "tp_goal_pct": 5,
            "tp_pass_rate": "yes" if 1 - ratio <= 0.05 else "no",
            "tp_pass_wait": "yes" if wait["store"] <= 0.05 else "no"}

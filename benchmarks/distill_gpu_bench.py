"""Distillation memory and speed on a real GPU at the paper's full shape, against the naive TTT.

``distill_bench.py --mode memory`` measures peak memory on the CPU at the paper shape scaled down
16x and *extrapolates* to a bf16 GPU run at T=4096 (20.5 GB, 16.6 GB with step checkpointing).
This script measures it: the Osprey drafter of the paper's Qwen3-8B setting (2 Qwen3 blocks of
d=2560 converted for a d=4096 target, 151,936-token vocabulary, K=5 TTT steps) is built at full
size on CUDA with fp32 master weights, and one real optimizer step (forward + backward + AdamW,
bf16 autocast, exactly as ``osprey_train.trainer.loop`` runs it) is timed and its
``torch.cuda.max_memory_allocated`` recorded per sequence length, per TTT attention backend
(``sdpa``, ``flex``), with and without TTT-step checkpointing; the naive reference (full
``[T, (k+1)T]`` mask, all K logits alive) runs at the lengths where it fits, for the ratio.

Each configuration runs in a fresh subprocess (so one out-of-memory leaves the others intact and
peaks do not leak between rows); times are CUDA-event medians of ``--repeats`` steps after one
warm-up. Ends with one ``RESULT`` line. ``--quick``: T = 1024, 4096 only, sdpa and naive.

Usage: ``python benchmarks/distill_gpu_bench.py [--seqs 1024,2048,4096,8192] [--repeats 3] [--quick]``
(``--device cpu --scale 16`` runs the same code on a CPU at a scaled shape, as a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from distill_bench import FULL, batch, build, naive_loss, params_full, shape  # noqa: E402

# The CPU extrapolation published before any GPU measurement (README "Measured", distill_bench).
EXTRAPOLATED_GB = {"plain": 20.5, "ckpt": 16.6}


def worker(impl: str, T: int, ckpt: bool, device: str, scale: int, repeats: int) -> dict:
    import torch

    from osprey_train.ttt.unroll import ttt_loss

    dev = torch.device(device)
    sh = shape(scale, scale)
    torch.manual_seed(0)
    with dev:  # initialize on the device: a CPU init of the full shape costs more than the run
        model = build(sh).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                            betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    autocast = (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev.type == "cuda"
                else torch.autocast(device_type="cpu", enabled=False))

    def step(b) -> float:
        opt.zero_grad(set_to_none=True)
        with autocast:
            if impl == "naive":
                loss = naive_loss(model, b, FULL["K"], 0.8)
            else:
                loss = ttt_loss(model, b, steps=FULL["K"], decay=0.8, target_dist="renorm", impl=impl,
                                chunk_size=1024, checkpoint_steps=ckpt).loss
        loss.backward()
        opt.step()
        return float(loss)

    step(batch(sh, 64).to(dev))  # warm-up: kernels, compilation (flex), optimizer state
    b = batch(sh, T).to(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times, loss = [], float("nan")
    for _ in range(repeats):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step(b)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            import time

            t0 = time.perf_counter()
            loss = step(b)
            times.append(time.perf_counter() - t0)
    times.sort()
    out = {"step_s": times[len(times) // 2], "loss": loss, "tokens_per_s": T / times[len(times) // 2]}
    if dev.type == "cuda":
        out["peak"] = torch.cuda.max_memory_allocated()
        out["static"] = base
        out["gpu"] = torch.cuda.get_device_name()
    return out


def run_worker(impl, T, ckpt, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, "--T", str(T), "--device", args.device,
           "--scale", str(args.scale), "--repeats", str(args.repeats)] + (["--ckpt"] if ckpt else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout {args.timeout}s"}
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"rc={out.returncode}"
        return {"error": "out of memory" if "OutOfMemory" in out.stderr else tail[-160:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--T", type=int)
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scale", type=int, default=1, help="divide widths and vocabulary (1 = the paper's shape)")
    ap.add_argument("--seqs", default="1024,2048,4096,8192")
    ap.add_argument("--naive-max", type=int, default=4096)
    ap.add_argument("--impls", default="sdpa,flex")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="write the table as markdown to this file")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.T, args.ckpt, args.device, args.scale, args.repeats)))
        return
    if args.quick:
        args.seqs, args.impls = "1024,4096", "sdpa"
    seqs = [int(s) for s in args.seqs.split(",")]
    impls = args.impls.split(",")
    GB = 2**30
    tr, fr = params_full()
    print(f"paper shape / {args.scale}: {shape(args.scale, args.scale)}; full-shape params: "
          f"{tr / 1e6:.0f}M trainable, {fr / 1e6:.0f}M frozen; device {args.device}")
    rows, result = [], {}
    header = "| T | backend | ckpt | peak GB | step s | tokens/s | naive peak GB | naive / ours |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    print(header)
    for T in seqs:
        naive = run_worker("naive", T, False, args) if T <= args.naive_max else {"error": "skipped"}
        for impl in impls:
            for ckpt in (False, True):
                r = run_worker(impl, T, ckpt, args)
                rows.append((T, impl, ckpt, r))
                peak = r.get("peak")
                ratio = (f"{naive['peak'] / peak:.2f}x" if peak and "peak" in naive else "-")
                head = f"| {T} | {impl} | {'yes' if ckpt else 'no'} | "
                if "error" in r:
                    line = head + f"{r['error']} | - | - | "
                else:
                    line = head + (f"{peak / GB:.2f}" if peak else "n/a (no CUDA)") + (
                        f" | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | ")
                line += (f"{naive['peak'] / GB:.2f} | {ratio} |" if "peak" in naive
                         else f"{naive.get('error', '-')} | - |")
                print(line, flush=True)
                lines.append(line)
                if peak:
                    tag = f"{impl}{'_ckpt' if ckpt else ''}_T{T}"
                    result[f"peak_gb_{tag}"] = round(peak / GB, 2)
                    result[f"tok_s_{tag}"] = round(r["tokens_per_s"])
        if "peak" in naive:
            result[f"peak_gb_naive_T{T}"] = round(naive["peak"] / GB, 2)
    gpu = next((r["gpu"] for *_, r in rows if "gpu" in r), args.device)
    for key, tag in (("plain", "sdpa_T4096"), ("ckpt", "sdpa_ckpt_T4096")):
        if f"peak_gb_{tag}" in result:
            measured = result[f"peak_gb_{tag}"]
            print(f"T=4096 sdpa{' + ckpt' if key == 'ckpt' else ''}: measured {measured:.2f} GB vs "
                  f"CPU extrapolation {EXTRAPOLATED_GB[key]} GB ({measured / EXTRAPOLATED_GB[key]:.2f}x); "
                  f"fits 24 GB: {measured < 24}")
            result[f"vs_extrapolation_{key}"] = round(measured / EXTRAPOLATED_GB[key], 3)
            result[f"fits_24gb_{key}"] = measured < 24
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"# Distillation at the paper's shape on {gpu}\n\n" + "\n".join(lines) + "\n")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in [("device", gpu.replace(" ", "_"))] + list(result.items())))


if __name__ == "__main__":
    main()

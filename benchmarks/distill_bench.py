"""Peak memory and step time of one TTT distill step: Osprey's implementation vs a naive one.

Shape: the paper's Osprey drafter (2 layers, d=2560, d_target=4096, 3 taps, vocab 151,936,
K=5 TTT steps; Qwen3-4B-like widths: 32 heads x 128, 8 KV heads, MLP 9728). On a CPU box that
does not fit in memory or time, so every WIDTH is divided by ``--scale`` (d, d_target, MLP, heads;
head_dim stays 128/scale-rounded) and the vocabulary by ``--vocab-scale``; sequence lengths are
the real ones (512..4096). Both implementations run the same model on the same packed batch:

* ``osprey`` — :func:`osprey_train.ttt.unroll.ttt_loss`: TTT attention without ``[T,(k+1)T]``
  masks (``sdpa``), LM head + loss chunked and recomputed under checkpointing.
* ``naive``  — materialized ``[T, (k+1)T]`` TTT masks (``naive`` attention) and full fp32
  ``[T, V]`` logits of all K steps alive until backward.

Each (implementation, T) runs in a fresh subprocess; its peak is the rise of the process's
resident high-water mark (``VmHWM``) over its resident size before the step (params, batch and
imports excluded; large allocations forced to ``mmap`` so freed memory leaves RSS). A warm-up
step at T=16 runs first so lazy kernel initialization stays out of the figure. Attention alone
(fwd+bwd of K=5 TTT steps of one layer, the scaled head count x head_dim 128, q/k/v included) is
measured the same way to show its memory is linear in T.

Extrapolation to the full shape on a GPU in bf16 (autocast, fp32 master weights + AdamW): static
memory is counted exactly from the full-shape parameter count (trainable 16 B/param, frozen
embedding 4 B/param); activation memory per token is the measured slope of ``osprey`` peak vs T
times the width ratio (every activation tensor is ``[T, width]``) times 1/2 (bf16); plus one
``[chunk, V]`` logits block (fp32, x3 for logits/softmax/grad).

Throughput (``--mode throughput``; ``--mode all``, the default, runs both sections): training
tokens/s of ``osprey train distill`` (:func:`osprey_train.stages.distill.run`, the real trainer)
reading its packed micro-batches from a feature store, against the same run fed the very same
batches already packed in memory. The store holds synthetic bf16 states of a real 8B-class
target width (d_target 4096, 3 taps, top-64; samples of 64..1024 tokens) in the default
``bf16-blosc`` codec, warm in the page cache; the drafter is tiny (1 layer, d=64, vocab 2,048), so a
CPU step is as short next to its data as a GPU step of the real shape, and any wait on the
store shows. Reading with the default background prefetch (2
micro-batches ahead) and without it (``prefetch=0``) are both measured; all three runs take
turns ``--tp-repeats`` times (median). Rates run from the start of step 1 to the start of the
last step (as in ``pretrain_bench``). Goal: from the store <= 5 % slower than from memory.

Usage: ``python benchmarks/distill_bench.py [--scale 8] [--vocab-scale 8] [--seqs 512,1024,2048,4096]``

``--mode remote [--quick] [--out DIR]``: reading for distillation from a store on object
storage vs the same store on local disk. A local S3 endpoint (moto's server over HTTP, as in
the tests; needs the ``test`` and ``s3`` extras) holds a copy of a synthetic store (hidden 1024,
3 taps, top-64, bf16 codec, 256-512-token samples); every epoch of the trainer's data path
(``StorePacker`` batches: shuffled samples, packed) is timed from the local copy and from
``s3://`` through the local shard cache with prefetch. Epoch 1 from S3 downloads everything
(one epoch straight from S3 without the cache shows what the cache buys); then the endpoint
is stopped and the later epochs read only the cache, local and cached reads taking turns batch
by batch: the goal is <= 10 % slower than local (median of per-epoch wall ratios; CPU-time
ratios shown too, being less sensitive to other load on the machine). Writes ``remote_read.md`` to ``--out``.

``[--mode memory|throughput|all] [--quick]`` (``--quick``: < 60 s: osprey at seqs 512,1024 and
naive at 512 only — no checkpointed or attention-only runs, so no checkpointed estimate, and the
extrapolation from such short sequences is rough — and a short throughput run). Ends with one ``RESULT`` line holding the figures of the sections run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

FULL = dict(d=2560, d_target=4096, intermediate=9728, heads=32, kv_heads=8, head_dim=128, vocab=151936,
            layers=2, taps=3, K=5)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def shape(scale: int, vocab_scale: int) -> dict:
    s = dict(FULL)
    s["d"] = FULL["d"] // scale
    s["d_target"] = FULL["d_target"] // scale
    s["intermediate"] = FULL["intermediate"] // scale
    s["heads"] = max(1, FULL["heads"] // scale)
    s["kv_heads"] = max(1, FULL["kv_heads"] // scale)
    s["head_dim"] = s["d"] // s["heads"]
    s["vocab"] = FULL["vocab"] // vocab_scale
    return s


def build(sh: dict):
    import torch

    from osprey_data.target_model import TapLayers
    from osprey_train.models import DrafterConfig
    from osprey_train.models.io import build_drafter

    cfg = DrafterConfig.from_name(
        "tiny", arch="osprey", family="qwen3", qk_norm=True, num_layers=sh["layers"], hidden_size=sh["d"],
        intermediate_size=sh["intermediate"], num_attention_heads=sh["heads"], num_key_value_heads=sh["kv_heads"],
        head_dim=sh["head_dim"], vocab_size=sh["vocab"], draft_vocab_size=sh["vocab"],
        target_hidden_size=sh["d_target"], max_position_embeddings=8192,
        tap_layers=TapLayers(layer_ids=(2, 18, 33)))
    torch.manual_seed(0)
    model = build_drafter(cfg)
    model.model.embed_tokens.weight.requires_grad_(False)  # as distill does by default
    return model


def batch(sh: dict, T: int):
    import torch

    from osprey_train.ttt.unroll import PackedBatch

    g = torch.Generator().manual_seed(0)
    V, K = sh["vocab"], 8
    lp = torch.log_softmax(torch.randn(T, 64, generator=g), -1)[:, :K]
    return PackedBatch(input_ids_BT=torch.randint(0, V, (1, T), generator=g),
                       doc_ids_BT=torch.zeros(1, T, dtype=torch.long), position_ids_BT=torch.arange(T)[None],
                       taps_BTLDt=torch.randn(1, T, sh["taps"], sh["d_target"], generator=g),
                       loss_mask_BT=torch.ones(1, T, dtype=torch.bool),
                       topk_ids_BTK=torch.randint(0, V, (1, T, K), generator=g), topk_logprobs_BTK=lp[None])


def naive_loss(model, b, steps, decay):
    """Full logits of every step kept alive, materialized TTT masks."""
    import torch

    from osprey_train.ttt.unroll import shift_left, step_valid, ttt_hidden_states

    cond0 = model.fuse_taps(b.taps_BTLDt)
    hs = ttt_hidden_states(model, b.input_ids_BT, cond0, b.position_ids_BT, b.doc_ids_BT, steps, impl="naive")
    logits = [model.logits(h).float() for h in hs]      # K x [T, V] fp32, all alive
    total = 0.0
    for k, lg in enumerate(logits):
        mask = shift_left(b.loss_mask_BT, k, False) & step_valid(b.doc_ids_BT, k)
        ids = shift_left(b.topk_ids_BTK, k, 0)[mask].long()
        p = torch.softmax(shift_left(b.topk_logprobs_BTK, k, 0.0)[mask], -1)
        logq = torch.log_softmax(lg[mask], -1).gather(1, ids)
        total = total + decay ** k * -(p * logq).sum(-1).mean()
    return total


def worker(impl: str, T: int, scale: int, vocab_scale: int, ckpt: bool) -> dict:
    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    from osprey_train.ttt.unroll import ttt_loss

    sh = shape(scale, vocab_scale)
    if impl == "attention":
        from osprey_train.ttt.attention import TTTAttention

        g = torch.Generator().manual_seed(0)
        H, Hk, hd = sh["heads"], sh["kv_heads"], FULL["head_dim"]

        def attn_step(n):
            qkv = [[torch.randn(1, h, n, hd, generator=g).requires_grad_() for h in (H, Hk, Hk)] for _ in range(5)]
            attn = TTTAttention(None, impl=os.environ.get("BENCH_ATTN", "sdpa"))
            out = sum(attn.at_step(k)(0, *qkv[k]).sum() for k in range(5))
            out.backward()

        attn_step(16)  # warm-up: load kernels outside the measurement
        before = _status("VmRSS")
        _reset_hwm()
        t0 = time.perf_counter()
        attn_step(T)   # (includes the q/k/v inputs: they are per-token memory too)
        return {"peak": _status("VmHWM") - before, "step_s": time.perf_counter() - t0}
    model = build(sh).train()
    b = batch(sh, 16)

    from osprey_data.target_model import resolve_precision

    precision = resolve_precision(os.environ.get("BENCH_PRECISION", "float32"), "cpu", training=True)

    def step():
        model.zero_grad(set_to_none=True)
        with precision.context():
            return _loss_backward()

    def _loss_backward():
        if impl == "osprey":
            loss = ttt_loss(model, b, steps=FULL["K"], decay=0.8, target_dist="renorm", impl="sdpa",
                            chunk_size=1024, checkpoint_steps=ckpt).loss
        else:
            loss = naive_loss(model, b, FULL["K"], 0.8)
        loss.backward()
        return float(loss)

    step()  # warm-up at T=16: lazy kernel/library initialization stays out of the measurement
    model.zero_grad(set_to_none=True)
    b = batch(sh, T)
    before = _status("VmRSS")
    _reset_hwm()
    t0 = time.perf_counter()
    loss = step()
    first = time.perf_counter() - t0
    peak = _status("VmHWM") - before
    return {"peak": peak, "step_s": first, "loss": loss}


def run_worker(impl, T, args, ckpt=False, precision="float32") -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", BENCH_PRECISION=precision)
    cmd = [sys.executable, __file__, "--worker", impl, "--T", str(T), "--scale", str(args.scale),
           "--vocab-scale", str(args.vocab_scale)] + (["--ckpt"] if ckpt else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"rc={out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def params_full() -> tuple[int, int]:
    """(trainable, frozen) parameter counts of the FULL shape, on the meta device."""
    import torch

    with torch.device("meta"):
        model = build(shape(1, 1))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return trainable, frozen


# --- remote store reading (--mode remote) -----------------------------------------------------


def _remote_store(local: str, remote: str, *, samples: int, T: int, D: int, shard_tokens: int) -> None:
    """The same synthetic store written to ``local`` and ``remote``."""
    import numpy as np

    from osprey_data.store import SampleRecord, StoreHeader, StoreWriter, TapLayers, TargetIdentity

    vocab, K, taps = 32000, 64, (2, 14, 27)
    header = StoreHeader(
        target=TargetIdentity(name_or_path="bench-target", model_type="llama", config_hash="bench",
                              tokenizer_hash="bench", vocab_size=vocab, hidden_size=D, num_layers=30,
                              dtype="bfloat16"),
        taps=TapLayers(layer_ids=taps), topk=K, hidden_codec="bf16", has_final_hidden=False,
        chat_template_hash="bench", generation={"greedy": True}, build_fingerprint="bench",
        build_config={"bench": True}, builder_version="bench")
    writers = [StoreWriter(url, header, shard_max_tokens=shard_tokens) for url in (local, remote)]
    rng = np.random.default_rng(0)
    for i in range(samples):
        n = int(rng.integers(T // 2, T + 1))
        hidden = (rng.standard_normal((n, len(taps), D)) * rng.uniform(0.5, 4.0, D)).astype(np.float32)
        rec = SampleRecord(
            sample_id=f"s{i:05d}", domain="bench", source="bench", conversation=[], prompt_length=n // 4,
            token_ids=rng.integers(0, vocab, n).astype(np.int32), loss_mask=np.arange(n) >= n // 4,
            finish_reason="stop", hidden_TLD=hidden, topk_ids_TK=rng.integers(0, vocab, (n, K)).astype(np.int32),
            topk_logprobs_TK=-np.sort(rng.random((n, K)).astype(np.float32) * 8, axis=1))
        for w in writers:
            w.add(rec)
    for w in writers:
        w.close()


def _epoch_s(readers: list, epoch: int, tokens_per_batch: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of one epoch of the distill data path (packed, shuffled batches) for
    each reader. With several readers they take turns batch by batch (alternating who goes
    first), so load from other processes hits all of them alike."""
    from osprey_train.distill_data.packing import StorePacker

    packers = [StorePacker(r, tokens_per_batch, seed=0) for r in readers]
    first = sum(len(packers[0].plan(e).rows) for e in range(epoch))
    totals = [[0.0, 0.0] for _ in readers]
    for row in range(len(packers[0].plan(epoch).rows)):
        order = range(len(readers)) if row % 2 == 0 else reversed(range(len(readers)))
        for k in order:
            t0, c0 = time.perf_counter(), time.process_time()
            packers[k].batch(first + row)
            totals[k][0] += time.perf_counter() - t0
            totals[k][1] += time.process_time() - c0
    return [tuple(t) for t in totals]


def remote_bench(args) -> None:
    import statistics
    import tempfile
    import uuid

    try:
        from tests.helpers.s3_server import start_s3_endpoint
    except ImportError as exc:
        raise SystemExit(f"--mode remote needs the test and s3 extras (pip install -e '.[test,s3]'): {exc}") from exc
    from osprey_data.store import StoreReader
    from osprey_data.store.cache import PREFETCHER

    samples, epochs = (96, 9) if args.quick else (192, 13)
    D, T, shard_tokens, tpb = 1024, 512, 4096, 4096
    out = args.out or tempfile.mkdtemp(prefix="distill-remote-")
    work = tempfile.mkdtemp(prefix="distill-remote-work-")
    endpoint = start_s3_endpoint()
    try:
        os.environ.update(endpoint.env("writer"))  # credentials from the environment, as in production
        local, remote = os.path.join(work, "store"), f"s3://{endpoint.bucket}/bench-{uuid.uuid4().hex[:6]}/store"
        t0 = time.perf_counter()
        _remote_store(local, remote, samples=samples, T=T, D=D, shard_tokens=shard_tokens)
        print(f"wrote {samples} samples (hidden {D}, 3 taps, top-64) locally and to {remote} "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
        local_r = StoreReader(local)
        cached_r = StoreReader(remote, cache=os.path.join(work, "cache"))
        plain_r = StoreReader(remote, cache=False)
        mb = sum(sh.num_bytes for sh in local_r.manifest.shards) / 1e6
        print(f"{local_r.num_tokens} tokens, {local_r.num_shards} shards, {mb:.0f} MB stored; "
              f"{tpb} tokens per batch", flush=True)
        first = (_epoch_s([local_r], 0, tpb)[0], _epoch_s([cached_r], 0, tpb)[0])
        PREFETCHER.wait(600)
        plain = _epoch_s([plain_r], 0, tpb)[0]
    finally:
        endpoint.stop()  # later epochs can only be served by the local cache
    print(f"epoch 1: local {first[0][0]:.2f} s, s3 + cache {first[1][0]:.2f} s (downloads); "
          f"s3 without cache {plain[0]:.2f} s; endpoint stopped", flush=True)
    rows = []
    for e in range(1, epochs):
        t_local, t_remote = _epoch_s([local_r, cached_r], e, tpb)
        rows.append((e + 1, t_local, t_remote))
        print(f"epoch {e + 1}: local {t_local[0]:.2f} s, s3 + cache {t_remote[0]:.2f} s "
              f"({t_remote[0] / t_local[0]:.2f}x wall, {t_remote[1] / t_local[1]:.2f}x CPU)", flush=True)
    wall = statistics.median(r[0] / lo[0] for _, lo, r in rows)
    cpu = statistics.median(r[1] / lo[1] for _, lo, r in rows)
    total = sum(r[0] for _, _, r in rows) / sum(lo[0] for _, lo, _ in rows)
    lines = ["| epoch | local s (CPU s) | s3 + cache s (CPU s) | wall ratio | CPU ratio |", "|---|---|---|---|---|"]
    lines += [f"| {e} | {lo[0]:.2f} ({lo[1]:.2f}) | {r[0]:.2f} ({r[1]:.2f}) | {r[0] / lo[0]:.3f} | {r[1] / lo[1]:.3f} |"
              for e, lo, r in [(1, *first), *rows]]
    lines += [f"| 1, s3 without cache | {first[0][0]:.2f} | {plain[0]:.2f} | {plain[0] / first[0][0]:.3f} | |", "",
              f"epochs >= 2 (endpoint stopped, cache only): median wall ratio {wall:.3f}, median CPU ratio "
              f"{cpu:.3f}, total wall ratio {total:.3f} (goal <= 1.10)"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "remote_read.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {os.path.join(out, 'remote_read.md')}")
    print(f"RESULT mode=remote tokens={local_r.num_tokens} mb={mb:.0f} local_epoch_s={min(lo[0] for _, lo, _ in rows):.2f} "
          f"s3_first_epoch_ratio={first[1][0] / first[0][0]:.2f} s3_no_cache_ratio={plain[0] / first[0][0]:.2f} "
          f"s3_cached_wall_ratio={wall:.3f} s3_cached_cpu_ratio={cpu:.3f} s3_cached_total_ratio={total:.3f} "
          f"goal_met={wall <= 1.10}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--T", type=int)
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--vocab-scale", type=int, default=16)
    ap.add_argument("--seqs", default="512,1024,2048,4096")
    ap.add_argument("--naive-max", type=int, default=4096, help="largest T run with the naive implementation")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--precisions", default="float32,bf16-autocast",
                    help="--mode precision: training precisions compared, float32 first")
    ap.add_argument("--precision-repeats", type=int, default=3, help="--mode precision: runs of each")
    ap.add_argument("--mode", choices=["memory", "throughput", "all", "remote", "precision"], default="all",
                    help="memory: peak memory vs naive; throughput: store vs in-memory batches; all: both; "
                         "remote: reading a store on S3 (+ cache) vs local disk")
    ap.add_argument("--quick", action="store_true", help="< 60 s: seqs 512,1024 and a short throughput run; "
                                                         "remote: a smaller store")
    ap.add_argument("--tp-steps", type=int, default=12, help="throughput: optimizer steps per run")
    ap.add_argument("--tp-repeats", type=int, default=3, help="throughput: runs of each contender")
    ap.add_argument("--tp-tokens", type=int, default=2048, help="throughput: tokens per packed micro-batch")
    ap.add_argument("--out", default=None, help="remote: folder for remote_read.md (default: temp)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if args.mode == "remote":
        remote_bench(args)
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.T, args.scale, args.vocab_scale, args.ckpt)))
        return
    if args.quick:
        args.seqs, args.naive_max = "512,1024", 512
        args.tp_steps, args.tp_repeats, args.tp_tokens = 5, 2, 1024
    result: dict[str, object] = {}
    if args.mode in ("memory", "all"):
        result.update(memory_section(args))
    if args.mode == "precision":
        result.update(precision_section(args))
    if args.mode in ("throughput", "all"):
        from distill_throughput import throughput_section

        result.update(throughput_section(args, build))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


def precision_section(args) -> dict:
    """One TTT distill step (forward + backward, the scaled paper shape) in each training precision,
    each run in a fresh process, the precisions taking turns: training tokens/s and peak memory
    as ratios to float32 in the same turn (median over ``--precision-repeats``)."""
    names = [n.strip() for n in args.precisions.split(",") if n.strip()]
    if names[0] != "float32":
        raise SystemExit("--precisions: float32 first (the ratios' baseline)")
    seqs = [int(x) for x in args.seqs.split(",")]
    sh = shape(args.scale, args.vocab_scale)
    print(f"distill step per precision: scale 1/{args.scale} (d={sh['d']}, d_target={sh['d_target']}, "
          f"vocab {sh['vocab']}), K={FULL['K']}, {os.environ.get('BENCH_THREADS', '1')} thread(s)")
    result: dict[str, object] = {}
    short = {"float32": "fp32", "bf16-autocast": "autocast"}
    for T in seqs:
        speed: dict[str, list[float]] = {n: [] for n in names}
        peak: dict[str, list[float]] = {n: [] for n in names}
        losses: dict[str, float] = {}
        for rep in range(args.precision_repeats):
            order = names[rep % len(names):] + names[: rep % len(names)]
            runs = {n: run_worker("osprey", T, args, precision=n) for n in order}
            if any("error" in r for r in runs.values()):
                raise SystemExit(f"T={T}: {runs}")
            for n in names:
                speed[n].append(runs["float32"]["step_s"] / runs[n]["step_s"])
                peak[n].append(runs[n]["peak"] / runs["float32"]["peak"])
                losses[n] = runs[n]["loss"]
        for n in names:
            sp, pk = statistics.median(speed[n]), statistics.median(peak[n])
            print(f"  T={T:5d} {n:14s} tokens/s x{sp:.2f} of float32, peak memory x{pk:.2f}, "
                  f"loss {losses[n]:.4f}", flush=True)
            result[f"{short.get(n, n)}_T{T}_speed_vs_fp32"] = round(sp, 3)
            result[f"{short.get(n, n)}_T{T}_peak_vs_fp32"] = round(pk, 3)
    return result


def memory_section(args) -> dict:
    """Peak memory vs T (osprey, checkpointed, naive, attention alone) and the GPU estimate."""
    seqs = [int(s) for s in args.seqs.split(",")]
    sh = shape(args.scale, args.vocab_scale)
    print(f"scaled shape (widths / {args.scale}, vocab / {args.vocab_scale}): {sh}")
    GB = 2**30
    rows = {}
    print(f"{'T':>6} | {'osprey GB':>9} {'s':>6} | {'osprey+ckpt GB':>14} | {'naive GB':>9} {'s':>6} | "
          f"{'mem naive/osprey':>16} | {'attn GB':>8}")
    for T in seqs:
        o = run_worker("osprey", T, args)
        c = run_worker("osprey", T, args, ckpt=True) if not args.quick else {"error": "skipped"}
        n = run_worker("naive", T, args) if T <= args.naive_max else {"error": "skipped"}
        a = run_worker("attention", T, args) if not args.quick else {"error": "skipped"}
        rows[T] = (o, c, n, a)
        fmt = lambda r, k: f"{r[k] / GB:.3f}" if k in r else "  -  "  # noqa: E731
        ft = lambda r: f"{r['step_s']:.1f}" if "step_s" in r else " - "  # noqa: E731
        ratio = f"{n['peak'] / o['peak']:.2f}x" if "peak" in n and "peak" in o else "-"
        print(f"{T:>6} | {fmt(o, 'peak'):>9} {ft(o):>6} | {fmt(c, 'peak'):>14} | {fmt(n, 'peak'):>9} {ft(n):>6} | "
              f"{ratio:>16} | {fmt(a, 'peak'):>8}", flush=True)

    import numpy as np

    Ts = np.array([T for T in seqs if "peak" in rows[T][0]], dtype=float)
    peaks = np.array([rows[int(T)][0]["peak"] for T in Ts], dtype=float)
    # Fit on T >= the loss chunk: below it the logits block itself still grows with T.
    fit = Ts >= 1024 if (Ts >= 1024).sum() >= 2 else np.ones_like(Ts, dtype=bool)
    slope, icpt = np.polyfit(Ts[fit], peaks[fit], 1)
    # Linearity: a quadratic term would make peak(Tmax)/peak(Tmin) grow like (Tmax/Tmin)^2.
    growth = peaks[-1] / peaks[0] if len(peaks) > 1 else float("nan")
    a_peaks = np.array([rows[int(T)][3].get("peak", np.nan) for T in Ts])
    a_growth = a_peaks[-1] / a_peaks[0] if len(a_peaks) > 1 else float("nan")
    ckpt_peaks = np.array([rows[int(T)][1].get("peak", np.nan) for T in Ts])
    c_slope = np.polyfit(Ts[fit], ckpt_peaks[fit], 1)[0] if np.all(np.isfinite(ckpt_peaks)) else float("nan")
    tr, fr = params_full()
    static = tr * 16 + fr * 4
    width_ratio = FULL["d"] / sh["d"]
    act_per_tok = slope * width_ratio * 0.5
    act_ckpt_per_tok = c_slope * width_ratio * 0.5
    logits_chunk = 1024 * FULL["vocab"] * 4 * 3
    est = (static + act_per_tok * 4096 + logits_chunk) / GB
    est_ckpt = (static + act_ckpt_per_tok * 4096 + logits_chunk) / GB
    print(f"\nosprey peak growth {Ts[0]:.0f}->{Ts[-1]:.0f} tokens: {growth:.2f}x for {Ts[-1] / Ts[0]:.0f}x tokens "
          f"(linear fit {slope / 2**10:.1f} KiB/token + {icpt / GB:.2f} GB); attention-only growth {a_growth:.2f}x")
    print(f"full shape: {tr / 1e6:.0f}M trainable + {fr / 1e6:.0f}M frozen params -> {static / GB:.1f} GB static "
          f"(fp32 master + AdamW); activations {act_per_tok / 2**10:.0f} KiB/token bf16 "
          f"({act_ckpt_per_tok / 2**10:.0f} with --gradient-checkpointing); logits chunk {logits_chunk / GB:.2f} GB")
    print(f"estimated GPU peak at T=4096, bf16: {est:.1f} GB ({est_ckpt:.1f} GB with checkpointing) vs 24 GB")
    nT = max((T for T in seqs if "peak" in rows[T][2]), default=None)
    ratio = rows[nT][2]["peak"] / rows[nT][0]["peak"] if nT else float("nan")
    return {"scale": args.scale, "vocab_scale": args.vocab_scale,
            f"osprey_peak_gb_T{int(Ts[-1])}": f"{peaks[-1] / GB:.3f}", f"naive_over_osprey_mem_T{nT}": f"{ratio:.2f}",
            f"osprey_growth_{int(Ts[0])}_to_{int(Ts[-1])}": f"{growth:.2f}", "attn_growth": f"{a_growth:.2f}",
            "est_gpu_bf16_gb_T4096": f"{est:.1f}", "est_gpu_bf16_ckpt_gb_T4096": f"{est_ckpt:.1f}",
            "fits_24gb": est < 24}


if __name__ == "__main__":
    main()

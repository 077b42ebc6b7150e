"""Build throughput of the builder backends on the same prompts, in one run: ``hf`` vs ``vllm``.

Each backend builds a store of the same prompts with the same settings (regeneration, greedy,
``--max-new-tokens``, batch ``--batch-size``, taps, top-k, precision), through
``osprey_data.builder.run`` exactly as ``osprey data build`` does. Figures per backend, from the
build summary: samples/s and stored tokens/s over the work time (generation + capture + store
writes), generated tokens/s over the same time, and the start-up (target loading; for vLLM the
engine process start), reported apart since it does not grow with the store. Then the vLLM
store's agreement with the HF one: samples with equal token ids, and the worst tap error
relative to verify's bar on those.

The vLLM backend runs vLLM in its own venv (``engines/setup_vllm.sh``; ``$OSPREY_VLLM_VENV`` or
``.venv-vllm``). ``--backends hf,sglang`` runs the SGLang backend the same way when this script
runs in SGLang's venv (``.ci/sglang_venv.sh``; bf16 there, pass ``--dtype bfloat16``).

Usage::

    OSPREY_VLLM_VENV=.venv-vllm python benchmarks/backend_bench.py \\
        --inputs ../shared/data/prompts/chat.eval.jsonl --limit 16 --max-new-tokens 64
    python benchmarks/backend_bench.py --quick      # 4 prompts, 16 tokens: ~50 s here, mostly vLLM's start

Target: SmolLM2-135M-Instruct from the demo's cache (fetched from PyPI once). Ends with one
``RESULT key=value ...`` line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_FALLBACK = [  # written for this benchmark, used when no --inputs are given
    "Explain why the sky is blue in two sentences.", "What is compound interest?",
    "Write a Python function that reverses a string.", "Name three prime numbers and say why they are prime.",
    "How do plants make food?", "Give me a tip for a healthy breakfast.",
]


def prompts(inputs: list[str], limit: int) -> list[dict]:
    """First user turn of each record (one generated turn per sample for every backend)."""
    rows: list[dict] = []
    for path in inputs:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip() and len(rows) < limit:
                rows.append(json.loads(line))
    if not inputs:
        rows = [{"id": f"bench-{i}", "conversations": [{"role": "user", "content": _FALLBACK[i % len(_FALLBACK)]}]}
                for i in range(limit)]
    out = []
    for r in rows:
        user = next(m for m in r["conversations"] if m["role"] == "user")
        out.append({"id": r["id"], "domain": r.get("domain", "bench"), "conversations": [user]})
    return out


def agreement(a_path: Path, b_path: Path) -> dict:
    """Samples of store ``a`` with ``b``'s token ids, and the worst tap error / verify bar on them."""
    import numpy as np

    from osprey_data.builder.verify_compare import bars_for, compare_hidden
    from osprey_data.store import StoreReader

    a, b = StoreReader(str(a_path)), StoreReader(str(b_path))
    bars = bars_for(a.header.hidden_codec.split("-")[0], a.header.build_config["dtype"], b.header.build_config["dtype"])
    by_id = {b.sample(i).sample_id: i for i in range(b.num_samples)}
    same, worst, top1 = 0, 0.0, []
    for i in range(a.num_samples):
        x = a.sample(i)
        y = b.sample(by_id[x.sample_id])
        if not np.array_equal(x.token_ids, y.token_ids):
            continue
        same += 1
        h = compare_hidden(x.hidden_TLD, y.hidden_TLD, codec=bars.codec, dtype_rel=bars.hidden_dtype_rel)
        worst = max(worst, float((h["rel_L"] / h["bar_L"]).max()))
        top1.append(float((x.topk_ids_TK[:, 0] == y.topk_ids_TK[:, 0]).mean()))
    return {"same_tokens": same, "samples": a.num_samples, "tap_err_over_bar": worst,
            "top1_agree": min(top1) if top1 else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", nargs="*", default=[])
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backends", default="hf,vllm", help="comma-separated; the first is the baseline")
    ap.add_argument("--quick", action="store_true", help="4 prompts, 16 new tokens")
    args = ap.parse_args()
    if args.quick:
        args.limit, args.max_new_tokens = 4, 16

    from osprey_data.builder import BuildConfig
    from osprey_data.builder.runner import run
    from osprey_data.target_model.fetch import fetch_smollm2

    target = str(fetch_smollm2())
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    rows = prompts(args.inputs, args.limit)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="backend-bench-") as tmp:
        inputs = Path(tmp) / "prompts.jsonl"
        inputs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        for name in backends:
            t0 = time.perf_counter()
            summary = run(BuildConfig(target=target, inputs=(str(inputs),), out=str(Path(tmp) / name), backend=name,
                                      device="cpu", dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                                      batch_size=args.batch_size, topk=args.topk, threads=args.threads,
                                      max_length=4096, progress=False))
            wall = time.perf_counter() - t0
            results[name] = {"samples_per_s": summary.samples_per_s, "tokens_per_s": summary.tokens_per_s,
                             "gen_tokens_per_s": summary.generated_tokens / summary.work_s if summary.work_s else 0.0,
                             "work_s": summary.work_s, "start_s": wall - summary.work_s,
                             "samples": summary.samples_written, "generated": summary.generated_tokens}
            r = results[name]
            print(f"{name:7s} {r['samples']} samples, {r['generated']} generated tokens: {r['samples_per_s']:.3f} "
                  f"samples/s, {r['tokens_per_s']:.1f} tokens/s stored, {r['gen_tokens_per_s']:.1f} generated tokens/s "
                  f"over {r['work_s']:.1f} s of work; start-up {r['start_s']:.1f} s", flush=True)
        base = backends[0]
        agree = {name: agreement(Path(tmp) / name, Path(tmp) / base) for name in backends[1:]}
    for name, a in agree.items():
        print(f"{name} vs {base}: {a['same_tokens']}/{a['samples']} samples with equal token ids; on those, worst tap "
              f"error {a['tap_err_over_bar']:.2f} x verify's bar, top-1 agreement >= {a['top1_agree']:.4f}")
    fields = [f"prompts={len(rows)}", f"max_new_tokens={args.max_new_tokens}", f"dtype={args.dtype}",
              f"threads={args.threads}"]
    for name, r in results.items():
        fields += [f"{name}_samples_per_s={r['samples_per_s']:.3f}", f"{name}_tokens_per_s={r['tokens_per_s']:.1f}",
                   f"{name}_gen_tokens_per_s={r['gen_tokens_per_s']:.1f}", f"{name}_start_s={r['start_s']:.1f}"]
        if name != base:
            fields.append(f"{name}_over_{base}_samples={r['samples_per_s'] / results[base]['samples_per_s']:.2f}")
            fields.append(f"{name}_same_tokens={agree[name]['same_tokens']}/{agree[name]['samples']}")
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())

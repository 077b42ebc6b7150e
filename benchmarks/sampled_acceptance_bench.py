"""Offline sampled acceptance vs live speculative sampling: the estimate, the live mean, their costs.

For each serving temperature T (``--temperatures``):

1. **store**: the builder samples the target at T on the prompts, each prompt ``--replicas``
   times (independent per-sample seeds), top-``--topk`` log-probs;
2. **offline**: ``osprey eval acceptance --temperature T`` on it (the estimator of
   :mod:`osprey_train.evaluation.sampled_acceptance`): expected AL with its 95% CI and the top-k
   tail bounds, per draft position;
3. **live**: real chain speculative sampling (``spec_decode.speculative_generate`` with
   ``verify_sampling``, the loop of ``osprey eval live``) of the same prompt ids, ``--seeds`` seeds
   each, same ``max_new_tokens``; AL = tokens / rounds pooled over runs, 95% CI over runs;
4. **cost**: seconds of each; at equal precision a measurement costs ``seconds * half_width^2``
   (the half-width shrinks as 1/sqrt(work)), so ``cost_ratio = (t_live h_live^2) / (t_off h_off^2)``;
   with and without the store build (a store is built once and serves every drafter and checkpoint).

Agreement per figure: the difference offline - live against its combined 95% half-width
``sqrt(h_off^2 + h_live^2)``. Target SmolLM2-135M-Instruct (``--target``, default: the demo's
cached copy) and ``--drafter DIR`` (e.g. the demo's distilled drafter); ``--quick`` (< 60 s) runs
a tiny random Llama with a drafter distilled for a few steps here. Writes ``--out``/table.md and
table.json; ends with one ``RESULT key=value ...`` line.

Usage::

    python benchmarks/sampled_acceptance_bench.py --quick
    python benchmarks/sampled_acceptance_bench.py --drafter osprey-demo/work/stages/distill-*/run/final \\
        --prompts osprey_train/demo/prompts.jsonl --limit 16 --seeds 4 --replicas 4 --max-new-tokens 48
    # the committed SmolLM2 validation: docs/results/sampled-acceptance/README.md (resumable: --work/results/)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def log(msg: str) -> None:
    print(msg, flush=True)


def replicated_prompts(src: Path, out: Path, limit: int, replicas: int) -> int:
    """``limit`` prompts of ``src`` (round-robin over domains), each ``replicas`` times under new ids."""
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    by_domain: dict[str, list[dict]] = {}
    for r in rows:
        by_domain.setdefault(r.get("domain", "default"), []).append(r)
    picked: list[dict] = []
    while len(picked) < min(limit, len(rows)):
        for d in sorted(by_domain):
            if by_domain[d] and len(picked) < limit:
                picked.append(by_domain[d].pop(0))
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({**r, "id": f"{r['id']}~r{k}"}) + "\n" for k in range(replicas) for r in picked)
    if not out.is_file() or out.read_text() != text:  # rewritten only when it changes, atomically: one run per
        tmp = out.with_suffix(".tmp")                 # temperature may share --work with another running
        tmp.write_text(text)
        tmp.replace(out)
    return len(picked)


def build_store(target: Path, prompts: Path, out: Path, temperature: float, args) -> float:
    from osprey_data.builder import BuildConfig
    from osprey_data.builder.runner import run as build

    t0 = time.perf_counter()
    build(BuildConfig(inputs=(str(prompts),), out=str(out), target=str(target), backend="hf", regenerate=True,
                      max_new_tokens=args.max_new_tokens, temperature=temperature, top_p=1.0, seed=args.store_seed,
                      topk=args.topk, hidden_codec="bf16-blosc", batch_size=args.batch_size, device="cpu", dtype="float32",
                      max_length=1024, progress=False, num_workers=1, worker_index=0,
                      layers=tuple(args.layers) if args.layers else None))
    return time.perf_counter() - t0


def offline(drafter_dir: Path, store: Path, temperature: float, steps: int) -> dict:
    from osprey_train.evaluation.acceptance import AcceptanceConfig, run

    t0 = time.perf_counter()
    rep = run(AcceptanceConfig(drafter=drafter_dir, store=str(store), steps=steps, device="cpu",
                               temperature=temperature, progress=False))
    sm = rep.sampled
    return {"al": rep.overall, "ci": sm["ci95"], "tail": sm["tail_bounds"], "per_position": rep.per_position,
            "per_position_ci": sm["per_position_ci95"], "samples": rep.num_samples, "tokens": rep.num_tokens,
            "outside_topk": sm["outside_topk"], "factors": sm["factors"], "seconds": time.perf_counter() - t0}


def exact_target(drafter_dir: Path, target: Path, store: Path, temperature: float, steps: int) -> dict:
    """Diagnostic, not offline: the same estimator with the target's EXACT full-vocabulary probabilities.

    The target is run (teacher-forced) over every stored sample and its whole temperature-1 softmax
    replaces the stored top-k, so no factor is uncertain: what is left of offline - live is the
    estimator's own error plus noise; what separates this from the offline figure is the top-k tail.
    """
    import torch

    from osprey_data.store import StoreReader
    from osprey_data.target_model import load_hf_target
    from osprey_train.evaluation.sampled_acceptance import (
        SampledTally,
        acceptance_factors,
        draft_path_probs,
        expected_rounds,
    )
    from osprey_train.models import load_drafter

    reader = StoreReader(str(store))
    drafter = load_drafter(drafter_dir, device="cpu").eval()
    model, _ = load_hf_target(str(target), device="cpu")
    tally = SampledTally(steps=steps)
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(len(reader)):
            smp = reader.sample(i, as_torch=True)
            ids_T = smp.token_ids.long()
            lp_TV = torch.log_softmax(model(ids_T[None]).logits[0].double(), -1).float()
            top_lp, top_ids = lp_TV.sort(-1, descending=True)
            q_PS = draft_path_probs(drafter, smp.token_ids, smp.hidden_TLD.float(), steps, temperature)
            lo, hi, _, _ = acceptance_factors(q_PS, smp.token_ids, top_ids, top_lp, temperature, lp_TV.shape[-1],
                                              smp.prompt_length)
            tally.add(smp.domain, expected_rounds(lo, hi, int(ids_T.shape[0]), smp.prompt_length, steps))
    fig = SampledTally.figures(tally.all())
    pos, pos_ci = tally.per_position()
    return {"al": fig["acceptance_length"], "ci": fig["ci95"], "per_position": pos, "per_position_ci": pos_ci,
            "seconds": time.perf_counter() - t0}


def live(drafter_dir: Path, target: Path, store: Path, temperature: float, steps: int, args) -> dict:
    import torch

    from osprey_data.conversation import stop_token_ids
    from osprey_data.store import StoreReader
    from osprey_data.target_model import load_hf_target
    from osprey_train.evaluation.live_drafter import DrafterSession
    from osprey_train.evaluation.sampled_acceptance import ratio_interval
    from osprey_train.evaluation.spec_decode import HFTargetSession, speculative_generate
    from osprey_train.models import load_drafter

    reader = StoreReader(str(store))
    prompts = []
    for i in range(len(reader)):  # replica 0 of every prompt: the same prompt ids the store answered
        s = reader.sample(i)
        if s.sample_id.endswith("~r0"):
            prompts.append([int(t) for t in s.token_ids[:s.prompt_length]])
    drafter = load_drafter(drafter_dir, device="cpu")
    model, tokenizer = load_hf_target(str(target), device="cpu")
    eos = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    session = DrafterSession(drafter, target_vocab_size=model.get_output_embeddings().weight.shape[0],
                             tap_codec="bf16")
    target_session = HFTargetSession(model, drafter.config.tap_layers.layer_ids)
    tokens, rounds = [], []
    reached, hits = [[] for _ in range(steps)], [[] for _ in range(steps)]
    seconds = 0.0
    for seed in range(args.seeds):
        # one JSON per seed, so a killed run resumes at the seed it was in (a session end kills it)
        part = checkpoint(args, f"live-t{temperature:g}-seed{seed}", drafter_dir, store, steps)
        got = load_checkpoint(part)
        if got is None:
            gen = torch.Generator().manual_seed(1000 + seed)
            got = {"tokens": [], "rounds": [], "reached": [[] for _ in range(steps)],
                   "hits": [[] for _ in range(steps)]}
            t0 = time.perf_counter()
            for ids in prompts:
                res = speculative_generate(target_session, session, ids, num_steps=steps,
                                           max_new_tokens=args.max_new_tokens, temperature=temperature, eos_ids=eos,
                                           generator=gen)
                got["tokens"].append(float(sum(res.accept_lengths)))
                got["rounds"].append(float(len(res.accept_lengths)))
                for s in range(steps):  # judged when every earlier draft was accepted (per_position_rates)
                    pairs = list(zip(res.accepted, res.drafted))
                    got["reached"][s].append(float(sum(1 for a, c in pairs if s < min(a + 1, c))))
                    got["hits"][s].append(float(sum(1 for a, c in pairs if s < min(a + 1, c) and s < a)))
            got["seconds"] = time.perf_counter() - t0
            save_checkpoint(part, got)
            log(f"T={temperature:g}: live seed {seed}: {sum(got['tokens']) / sum(got['rounds']):.3f} tokens/round "
                f"in {got['seconds']:.1f} s")
        tokens += got["tokens"]
        rounds += got["rounds"]
        for s in range(steps):
            reached[s] += got["reached"][s]
            hits[s] += got["hits"][s]
        seconds += got["seconds"]
    al, lo, hi = ratio_interval(tokens, rounds)
    pos = [ratio_interval(hits[s], reached[s]) for s in range(steps)]
    return {"al": al, "ci": [lo, hi], "per_position": [p[0] for p in pos], "per_position_ci": [[p[1], p[2]] for p in pos],
            "runs": len(tokens), "prompts": len(prompts), "tokens": int(sum(tokens)), "seconds": seconds}


def checkpoint(args, name: str, drafter_dir: Path, store: Path, steps: int) -> dict:
    """Where one phase's result is kept, and the settings it must have been measured with to be reused."""
    key = {"drafter": str(Path(drafter_dir).resolve()), "store": str(Path(store).resolve()), "steps": steps,
           "max_new_tokens": args.max_new_tokens, "seeds_base": 1000, "threads": args.threads}
    return {"path": args.work / "results" / f"{name}.json", "key": key}


def load_checkpoint(part: dict) -> dict | None:
    """The saved result of a phase measured with the same settings, else None (measure it again)."""
    path = part["path"]
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if saved.get("key") != part["key"]:
        log(f"{path}: measured with other settings; measuring again")
        return None
    log(f"{path}: reused")
    return saved["result"]


def save_checkpoint(part: dict, result: dict) -> None:
    """Write atomically (temp file + rename): a kill mid-write leaves no half file that looks complete."""
    path = part["path"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"key": part["key"], "result": result}, indent=1))
    tmp.replace(path)


def half(ci) -> float:
    return (ci[1] - ci[0]) / 2


def quick_setup(work: Path) -> tuple[Path, Path, Path]:
    """A tiny random Llama, a prompt file and a drafter distilled a few steps on a greedy store."""
    from osprey_data.store import StoreReader
    from osprey_train.models import load_drafter, save_drafter
    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer
    from tests.train.evaluation.store_util import make_drafter_dir, make_prompts, make_store, quick_distill

    target = work / "tiny-target"
    if not (target / "config.json").is_file():
        make_tiny_llama(target, make_tiny_tokenizer(work / "tiny-tok"))
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in make_prompts(8)))
    drafter_dir = work / "drafter"
    if not (drafter_dir / "config.json").is_file():
        store = make_store(work / "greedy", target, num_samples=8, max_new_tokens=16)
        make_drafter_dir(drafter_dir, seed=1, store=store)
        drafter = quick_distill(load_drafter(drafter_dir), StoreReader(str(store)), steps=60)
        save_drafter(drafter, drafter_dir)
    return target, prompts, drafter_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny random target and drafter, < 60 s")
    ap.add_argument("--target", type=Path, default=None, help="HF target folder (default: cached SmolLM2)")
    ap.add_argument("--drafter", type=Path, default=None)
    ap.add_argument("--prompts", type=Path, default=REPO / "osprey_train" / "demo" / "prompts.jsonl")
    ap.add_argument("--limit", type=int, default=16, help="prompts")
    ap.add_argument("--replicas", type=int, default=4, help="stored samples per prompt (independent seeds)")
    ap.add_argument("--seeds", type=int, default=4, help="live runs per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--layers", type=lambda s: [int(v) for v in s.split(",")], default=None)
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--store-seed", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=8, help="store build batch")
    ap.add_argument("--exact-target-check", action="store_true",
                    help="also the estimator with the target's exact full-vocabulary probabilities (diagnostic)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("runs/sampled_bench"))
    ap.add_argument("--out", type=Path, default=Path("runs/sampled_bench/out"))
    ap.add_argument("--build-only", action="store_true", help="only build the stores (needs --layers), e.g. while "
                                                                  "the drafter trains")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.limit, args.replicas, args.seeds, args.max_new_tokens, args.steps = 6, 6, 6, 12, 2
        args.topk, args.layers = 384, [2, 3, 4]
        target, args.prompts, drafter_dir = quick_setup(args.work / "quick")
    else:
        if args.drafter is None and not (args.build_only and args.layers):
            ap.error("--drafter is required without --quick (or --build-only with --layers)")
        from osprey_data.target_model.fetch import fetch_smollm2

        target, drafter_dir = args.target or Path(fetch_smollm2()), args.drafter
        if args.layers is None and drafter_dir is not None:
            from osprey_train.models import load_drafter

            args.layers = list(load_drafter(drafter_dir).config.tap_layers.layer_ids)
    prompt_file = args.work / "prompts.replicated.jsonl"
    n_prompts = replicated_prompts(args.prompts, prompt_file, args.limit, args.replicas)
    rows = []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        store = args.work / f"store-t{temperature:g}-k{args.topk}-n{args.max_new_tokens}-{n_prompts}x{args.replicas}"
        build_s = 0.0
        if not (store / "done").is_file():
            import shutil

            shutil.rmtree(store, ignore_errors=True)
            log(f"T={temperature:g}: building the store ({n_prompts} prompts x {args.replicas}) ...")
            build_s = build_store(target, prompt_file, store, temperature, args)
            (store / "done").write_text(f"{build_s}\n")
        else:
            build_s = float((store / "done").read_text())
        if args.build_only:
            continue
        part = checkpoint(args, f"offline-t{temperature:g}", drafter_dir, store, args.steps)
        off = load_checkpoint(part)
        if off is None:
            off = offline(drafter_dir, store, temperature, args.steps)
            save_checkpoint(part, off)
        log(f"T={temperature:g}: offline AL {off['al']:.4f} CI {off['ci']} in {off['seconds']:.1f} s")
        liv = live(drafter_dir, target, store, temperature, args.steps, args)
        exact = None
        if args.exact_target_check:
            part = checkpoint(args, f"exact-t{temperature:g}", drafter_dir, store, args.steps)
            exact = load_checkpoint(part)
            if exact is None:
                exact = exact_target(drafter_dir, target, store, temperature, args.steps)
                save_checkpoint(part, exact)
        log(f"T={temperature:g}: live AL {liv['al']:.4f} CI {liv['ci']} over {liv['runs']} runs in {liv['seconds']:.1f} s")
        comb = math.hypot(half(off["ci"]), half(liv["ci"]))
        ratio = (liv["seconds"] * half(liv["ci"]) ** 2) / max(off["seconds"] * half(off["ci"]) ** 2, 1e-12)
        ratio_build = (liv["seconds"] * half(liv["ci"]) ** 2) / max((off["seconds"] + build_s) * half(off["ci"]) ** 2,
                                                                    1e-12)
        pos = []
        for s in range(args.steps):
            c = math.hypot(half(off["per_position_ci"][s]), half(liv["per_position_ci"][s]))
            pos.append({"offline": off["per_position"][s], "offline_ci": off["per_position_ci"][s],
                        "live": liv["per_position"][s], "live_ci": liv["per_position_ci"][s],
                        "agree": abs(off["per_position"][s] - liv["per_position"][s]) <= c,
                        "offline_in_live_ci": liv["per_position_ci"][s][0] <= off["per_position"][s]
                        <= liv["per_position_ci"][s][1]})
        rows.append({"temperature": temperature, "offline": off, "live": liv, "build_seconds": build_s,
                     "diff": off["al"] - liv["al"], "combined_half_width": comb,
                     "agree": abs(off["al"] - liv["al"]) <= comb,
                     "offline_in_live_ci": liv["ci"][0] <= off["al"] <= liv["ci"][1],
                     "cost_ratio": ratio, "cost_ratio_with_build": ratio_build, "per_position": pos,
                     "exact_target": exact})
    if args.build_only:
        return
    write_table(rows, args, n_prompts, target, drafter_dir)
    agree = all(r["agree"] and all(p["agree"] for p in r["per_position"]) for r in rows)
    parts = [f"RESULT quick={int(args.quick)}"]
    for r in rows:
        t = f"{r['temperature']:g}"
        parts += [f"T{t}_offline={r['offline']['al']:.4f}", f"T{t}_live={r['live']['al']:.4f}",
                  f"T{t}_diff={r['diff']:+.4f}", f"T{t}_halfwidth={r['combined_half_width']:.4f}",
                  f"T{t}_cost_ratio={r['cost_ratio']:.1f}", f"T{t}_cost_ratio_with_build={r['cost_ratio_with_build']:.2f}"]
    parts.append(f"all_agree={int(agree)}")
    print(" ".join(parts))


def write_table(rows, args, n_prompts, target, drafter_dir) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    ci = lambda c: f"[{c[0]:.3f}, {c[1]:.3f}]"  # noqa: E731
    lines = [f"# Offline sampled acceptance vs live speculative sampling (S={args.steps})", "",
             f"Target `{target}`, drafter `{drafter_dir}`; {n_prompts} prompts, max_new_tokens {args.max_new_tokens}; "
             f"offline: {args.replicas} stored samples per prompt (top-{args.topk}); live: {args.seeds} seeds per prompt; "
             f"CPU, {args.threads} thread(s). 95% intervals.", "",
             "| T | offline AL (CI) | tail bounds | live AL (CI) | offline - live | combined half-width | agree | "
             "offline inside live CI | offline s | live s | store build s | cost ratio (with build) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, v = r["offline"], r["live"]
        lines.append(f"| {r['temperature']:g} | {o['al']:.3f} {ci(o['ci'])} | {ci(o['tail'])} | {v['al']:.3f} {ci(v['ci'])} "
                     f"| {r['diff']:+.3f} | {r['combined_half_width']:.3f} | {'yes' if r['agree'] else 'NO'} "
                     f"| {'yes' if r['offline_in_live_ci'] else 'no'} "
                     f"| {o['seconds']:.1f} | {v['seconds']:.1f} | {r['build_seconds']:.1f} "
                     f"| {r['cost_ratio']:.1f} ({r['cost_ratio_with_build']:.2f}) |")
    lines += ["", "Per draft position (conditional acceptance rate):", "",
              "| T | position | offline (CI) | live (CI) | agree | offline inside live CI |", "|---|---|---|---|---|---|"]
    for r in rows:
        for s, p in enumerate(r["per_position"]):
            lines.append(f"| {r['temperature']:g} | {s + 1} | {p['offline']:.3f} {ci(p['offline_ci'])} | "
                         f"{p['live']:.3f} {ci(p['live_ci'])} | {'yes' if p['agree'] else 'NO'} "
                         f"| {'yes' if p['offline_in_live_ci'] else 'no'} |")
    exact_rows = [r for r in rows if r.get("exact_target")]
    if exact_rows:
        lines += ["", "Diagnostic (not offline): the estimator on the same stored samples with the target's exact "
                  "full-vocabulary probabilities (teacher-forced target) instead of the stored top-k:", "",
                  "| T | AL (CI) | in live CI | " + " | ".join(f"position {s + 1}" for s in range(args.steps)) + " |",
                  "|---|---|---|" + "---|" * args.steps]
        for r in exact_rows:
            e = r["exact_target"]
            inside = r["live"]["ci"][0] <= e["al"] <= r["live"]["ci"][1]
            lines.append(f"| {r['temperature']:g} | {e['al']:.3f} {ci(e['ci'])} | {'yes' if inside else 'no'} | "
                         + " | ".join(f"{v:.3f} {ci(c)}" for v, c in zip(e["per_position"], e["per_position_ci"]))
                         + " |")
    lines += ["", "Samples: " + "; ".join(
        f"T={r['temperature']:g}: offline {r['offline']['samples']} stored samples / {r['offline']['tokens']} tokens "
        f"({r['offline']['outside_topk']} of {r['offline']['factors']} judged tokens outside the top-k), "
        f"live {r['live']['runs']} runs / {r['live']['tokens']} tokens" for r in rows)]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    (args.out / "table.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                     "rows": rows}, indent=2))
    log(f"wrote {args.out / 'table.md'}")


if __name__ == "__main__":
    main()

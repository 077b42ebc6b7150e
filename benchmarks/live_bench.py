"""Live speculative decoding: the cost of each piece of a round, the acceptance that pays for it,
and our plain decoding against ``transformers``' ``generate`` — all in one run.

Target: SmolLM2-135M-Instruct from the demo's cache (fetched from PyPI once), or with ``--quick``
(<= 60 s) a tiny random Llama built on the fly. Batch 1, greedy, CPU. Sections:

1. **plain decoding**: our harness (``spec_decode.plain_generate``) against ``model.generate`` on
   the same prompts, interleaved and alternating which goes first; tokens/s ratio (goal >= 0.95)
   and identical outputs.
2. **costs**, at a fixed context, each the median of interleaved repeats and expressed in plain
   decode steps (one target forward of one token, the unit): one target forward over ``n`` new
   tokens with the drafter's taps (the verify of ``S = n - 1`` drafts), n = 1..16; one drafter
   chain step (the marginal cost of one more draft in ``DrafterSession.propose``: one drafter
   forward of one token + its LM head), also for the same drafter with a full-vocabulary head.
3. **speculative decoding** of held-out prompts for S = 1..5 and ``auto`` (``--quick``: S = 3 and
   ``auto``; ``--steps`` picks) against plain decoding of the same prompts (``auto`` is ``osprey
   eval live --steps auto``: costs measured first, then S in 0..``--max-steps`` chosen per round): acceptance length (SGLang's, as ``osprey eval live``), tokens/s
   ratio end to end, and in the decode phase alone (prefill excluded), which is what the model
   below predicts. The per-round overhead (drafter extend, taps, verification bookkeeping,
   Python) is what the measured decode time per round leaves after ``S * draft_step +
   verify(S + 1)``; the median over S is used.
4. **model**: a round costs ``S * draft_step + verify(S + 1) + round_overhead`` plain steps and
   emits AL tokens, so the break-even acceptance length is ``AL*(S)`` = that cost and the
   predicted decode speedup is ``AL / AL*(S)``. Goal at S = 3: ``AL* <= 1.6``.

The drafter is ``--drafter DIR``, or one built here (and cached in ``--work``): the target pruned
to 2 blocks (no pre-training), converted with ``--draft-vocab`` from a store of the demo's
training prompts, distilled ``--distill-steps`` TTT steps. The live prompts are the demo's
held-out ones, or the first ``--prompts`` of ``--eval-prompts FILE`` (a conversation JSONL as
``osprey eval live --input`` reads, taken round-robin across its domains), e.g. the held-out
prompts a study drafter was evaluated on. Writes ``live_bench.md``, ``live_bench.png`` (predicted speedup vs acceptance
length for S = 1..5 with the measured points) and ``live_bench.json`` to ``--out``;
``--cost-out FILE`` writes the costs as the project's cost model
(:class:`osprey_train.evaluation.cost_model.CostModel`, ``schemas/cost-model.v1.json``), which
``osprey eval sweep --cost FILE`` reads; it includes ``draft_step_by_width`` (one drafter call over
2, 4 and 8 tree branches, relative to the chain step). Ends with one ``RESULT key=value ...`` line.

Usage::

    python benchmarks/live_bench.py --quick
    python benchmarks/live_bench.py --cost-out runs/live_bench/cost.json
    python benchmarks/live_bench.py --drafter runs/demo/work/distill/final --draft-vocab 0
    python benchmarks/live_bench.py --precision-only --drafter DIR --eval-prompts prompts.eval.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEPS = (1, 2, 3, 4, 5)
AUTO = "auto"
VERIFY_MAX = 16
GOAL_HARNESS = 0.95
GOAL_BREAK_EVEN_S3 = 1.6


def lossless_line(identical: int | None, runs: int | None) -> str:
    """``identical k/n`` beside a speedup; NOT LOSSLESS (and never counted) when k < n."""
    from osprey_train.evaluation.live_report import lossless_line as line

    return line(identical, runs or 0)


def log(msg: str) -> None:
    print(msg, flush=True)


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ------------------------------------------------------------------------------- setup


def tiny_target(work: Path) -> Path:
    """A random 8-layer Llama (d=256) with a 2048-token tokenizer, built once in ``work``."""
    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer

    folder = work / "tiny-target"
    if not (folder / "config.json").is_file():
        tok = make_tiny_tokenizer(work / "tiny-tok", vocab_size=2048)
        make_tiny_llama(folder, tok, num_layers=8, hidden_size=256)
    return folder


def make_drafter(args, target: Path, work: Path, train_file: Path) -> Path:
    """Prune the target to 2 blocks, convert (--draft-vocab) on a store, distill: cached by settings."""
    from osprey_data.builder import BuildConfig
    from osprey_data.builder.runner import run as build
    from osprey_train.stages.convert import ConvertConfig
    from osprey_train.stages.convert import run as convert
    from osprey_train.stages.defaults import distill_optim
    from osprey_train.stages.distill import DistillConfig
    from osprey_train.stages.distill import run as distill
    from osprey_train.stages.prune import PruneConfig
    from osprey_train.stages.prune import run as prune
    from osprey_train.trainer import LoopConfig

    key = hashlib.sha256(json.dumps([str(target), args.train_prompts, args.store_tokens, args.draft_vocab,
                                     args.distill_steps, 1]).encode()).hexdigest()[:12]
    root = work / f"drafter-{key}"
    final = root / "distill" / "final"
    if (final / "config.json").is_file():
        log(f"drafter: cached {final}")
        return final
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    store = root / "store"
    if not (root / "store.done").is_file():  # a store from an interrupted run is rebuilt
        shutil.rmtree(store, ignore_errors=True)
        log(f"drafter: building a store of {args.train_prompts} prompts x {args.store_tokens} tokens ...")
        build(BuildConfig(inputs=(str(train_file),), out=str(store), target=str(target), backend="hf",
                          regenerate=True, max_new_tokens=args.store_tokens, temperature=0.0, topk=32,
                          hidden_codec="bf16-blosc", batch_size=8, device="cpu", dtype="float32",
                          max_length=1024, progress=False, num_workers=1, worker_index=0))
        (root / "store.done").write_text("ok\n")
    for name in ("backbone", "init", "distill"):
        shutil.rmtree(root / name, ignore_errors=True)
    prune(PruneConfig(source=str(target), layers=2, out=root / "backbone"))
    convert(ConvertConfig(backbone=root / "backbone", target=str(target), store=str(store), out=root / "init",
                          draft_vocab_size=args.draft_vocab or None))
    log(f"drafter: distilling {args.distill_steps} TTT steps ...")
    loop = LoopConfig(out_dir=root / "distill", max_steps=args.distill_steps, device="cpu", seed=0,
                      progress=False, distributed="none", log_every=max(1, args.distill_steps // 5))
    distill(DistillConfig(drafter=root / "init", store=str(store), loop=loop,
                          optim=distill_optim(lr=5e-4 if not args.quick else 3e-3, warmup_ratio=0.1),
                          ttt_steps=3, tokens_per_batch=256))
    log(f"drafter: built in {time.perf_counter() - t0:.0f} s -> {final}")
    return final


# ------------------------------------------------------------------------------- sections


def plain_section(args, model, target, prompts, eos) -> dict:
    """Our plain decoding vs model.generate, interleaved, alternating order."""
    import torch

    from osprey_train.evaluation.spec_decode import plain_generate

    def ours(p):
        r = plain_generate(target, p, max_new_tokens=args.max_new_tokens, eos_ids=eos)
        return r.seconds, r.output_ids

    def theirs(p):
        x = torch.tensor([p])
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0])
        seconds = time.perf_counter() - t
        return seconds, out[0, len(p):].tolist()

    ours(prompts[0])  # warm-up
    theirs(prompts[0])
    ours_s, theirs_s, tokens, identical = [], [], 0, 0
    for rep in range(args.repeats):
        for i, p in enumerate(prompts):
            if (i + rep) % 2:
                b, ob = theirs(p)
                a, oa = ours(p)
            else:
                a, oa = ours(p)
                b, ob = theirs(p)
            ours_s.append(a)
            theirs_s.append(b)
            identical += oa == ob
            tokens += len(oa)
    ratio = sum(theirs_s) / sum(ours_s)  # same tokens on both sides: time ratio = tokens/s ratio
    per_prompt = statistics.median(t / o for t, o in zip(theirs_s, ours_s))
    log(f"plain decoding: {tokens / sum(ours_s):.1f} tok/s ours vs {tokens / sum(theirs_s):.1f} tok/s generate "
        f"-> x{ratio:.3f} (median per prompt x{per_prompt:.3f}; goal >= {GOAL_HARNESS}); "
        f"identical outputs {identical}/{len(ours_s)}")
    return {"harness_vs_generate": ratio, "harness_vs_generate_median": per_prompt,
            "harness_tok_s": tokens / sum(ours_s), "generate_tok_s": tokens / sum(theirs_s),
            "identical": identical, "runs": len(ours_s)}


def cost_section(args, target, session, full_session, context_ids) -> dict:
    """Plain step, verify(n), drafter step (draft vocab and full vocab), medians of interleaved repeats."""
    ids = list(context_ids)
    base = len(ids) - 1  # the cache covers every committed token but the last
    target.reset(capacity=len(ids) + VERIFY_MAX)
    _, taps = target.forward(ids[:-1], want_taps=True, logits_for=1)
    for s in (session, full_session):
        s.reset()
        s.propose(ids, taps, 1, 0.0, None)  # extend every slot once
    filler = [ids[(3 * i + 1) % len(ids)] for i in range(VERIFY_MAX)]

    def target_forward(n: int, want_taps: bool):
        block = [ids[-1], *filler[: n - 1]]
        t = time.perf_counter()
        target.forward(block, want_taps=want_taps, logits_for=None if want_taps else 1)
        seconds = time.perf_counter() - t
        target.crop(base)
        return seconds

    import torch

    widths = (1, 2, 4, 8)
    cond_1KD = torch.randn(1, max(widths), session.config.hidden_size)

    def width_step(k: int) -> float:
        # one tree depth: k frontier nodes in one drafter call after the committed slots, then their heads
        length = session.attention.length
        t = time.perf_counter()
        with torch.no_grad():
            hidden = session.drafter.forward_hidden(torch.tensor([filler[:k]]), cond_1KD[:, :k],
                                                    torch.full((1, k), len(ids), dtype=torch.long),
                                                    session.attention)
            torch.topk(session.drafter.logits(hidden)[0].float(), k, dim=-1)
        seconds = time.perf_counter() - t
        session.attention.truncate(length)
        return seconds

    def propose(s, steps: int) -> float:
        # the state of a round whose last verify committed one token: one slot to extend, then `steps` drafts
        s.slots -= 1
        s.attention.truncate(s.attention.length - 1)
        t = time.perf_counter()
        s.propose(ids, taps[-1:], steps, 0.0, None)
        return time.perf_counter() - t

    for _ in range(2):  # warm-up
        target_forward(1, False), target_forward(4, True), propose(session, 5), propose(full_session, 5)
    samples: dict[str, list[float]] = {}
    order = [("plain", 1)] + [("verify", n) for n in range(1, VERIFY_MAX + 1)] + \
        [("draft", 1), ("draft", 5), ("full", 1), ("full", 5)] + [("width", k) for k in widths]
    rng = random.Random(0)
    for _ in range(args.cost_repeats):
        rng.shuffle(order)  # interleaved, in a new order every repeat: drift hits every figure alike
        for kind, n in order:
            if kind == "plain":
                value = target_forward(1, False)
            elif kind == "verify":
                value = target_forward(n, True)
            elif kind == "width":
                value = width_step(n)
            else:
                value = propose(session if kind == "draft" else full_session, n)
            samples.setdefault(f"{kind}{n}", []).append(value)
    med = {k: statistics.median(v) for k, v in samples.items()}
    plain = med["plain1"]
    verify = {n: med[f"verify{n}"] / plain for n in range(1, VERIFY_MAX + 1)}
    draft = (med["draft5"] - med["draft1"]) / 4 / plain
    full = (med["full5"] - med["full1"]) / 4 / plain
    extend = med["draft1"] / plain - draft  # propose(S=1) = extend of one slot + one draft step
    # a tree depth over k branches, scaled to the chain step measured above
    by_width = {k: draft * med[f"width{k}"] / med["width1"] for k in widths if k > 1}
    log(f"costs at a context of {len(ids)} tokens, in plain steps of {plain * 1e3:.2f} ms: "
        f"draft step {draft:.3f} (full-vocabulary head {full:.3f}; over 2/4/8 branches "
        f"{by_width[2]:.3f}/{by_width[4]:.3f}/{by_width[8]:.3f}), extend of one slot {extend:.3f}, "
        + ", ".join(f"verify({n}) {verify[n]:.2f}" for n in (1, 2, 4, 6, 8, 16)))
    return {"plain_step_seconds": plain, "verify": verify, "draft_step": draft, "draft_step_full_vocab": full,
            "draft_step_by_width": by_width, "extend_one_slot": extend, "context": len(ids)}


def spec_section(args, target, session, prompts, eos, costs) -> dict:
    """Speculative vs plain decoding of the held-out prompts for every S; per-round overhead."""
    from osprey_train.evaluation.draft_length import DraftLengthPolicy, measure_costs
    from osprey_train.evaluation.spec_decode import plain_generate, speculative_generate

    steps = tuple(args.steps)
    policy = None
    if AUTO in steps:
        # what `osprey eval live --steps auto` does without --cost: costs measured on this target and
        # drafter first, then one policy for every prompt and repeat (it learns as decoding goes)
        t = time.perf_counter()
        cost = measure_costs(target, session, prompts[0], args.max_steps, what="measured at the start (live_bench)")
        policy = DraftLengthPolicy(cost=cost, max_steps=args.max_steps)
        log(f"--steps auto: costs measured in {time.perf_counter() - t:.1f} s: draft step {cost.draft_step:.3f}, "
            f"round overhead {cost.round_overhead:.3f}, verify(1..{args.max_steps + 1}) "
            + "/".join(f"{cost.verify[n]:.2f}" for n in sorted(cost.verify)))
    prefill = {}
    for i, p in enumerate(prompts):  # the prefill, which both sides pay once per prompt
        def run_prefill(p=p):
            target.reset(capacity=len(p) + 1)
            target.forward(p, want_taps=True, logits_for=1)
        prefill[i] = median_seconds(run_prefill, 3)
    speculative_generate(target, session, prompts[0], num_steps=3, max_new_tokens=8, eos_ids=eos)  # warm-up
    agg = {s: {"spec": 0.0, "spec_decode": 0.0, "plain": 0.0, "plain_decode": 0.0, "plain_steps": 0, "rounds": 0,
               "emitted": 0, "identical": 0, "runs": 0} for s in steps}
    for rep in range(args.spec_repeats):
        for i, p in enumerate(prompts):
            order = list(steps) + ["plain"]
            if (i + rep) % 2:
                order.reverse()
            results = {}
            for what in order:
                if what == "plain":
                    results[what] = plain_generate(target, p, max_new_tokens=args.max_new_tokens, eos_ids=eos)
                elif what == AUTO:
                    results[what] = speculative_generate(target, session, p, num_steps=args.max_steps,
                                                         max_new_tokens=args.max_new_tokens, eos_ids=eos,
                                                         policy=policy)
                else:
                    results[what] = speculative_generate(target, session, p, num_steps=what,
                                                         max_new_tokens=args.max_new_tokens, eos_ids=eos)
            plain = results["plain"]
            for s in steps:
                r, a = results[s], agg[s]
                a["spec"] += r.seconds
                a["spec_decode"] += r.seconds - prefill[i]
                a["plain"] += plain.seconds
                a["plain_decode"] += plain.seconds - prefill[i]
                a["plain_steps"] += len(plain.output_ids) - 1  # the first token comes from the prefill
                a["rounds"] += len(r.accept_lengths)
                a["emitted"] += sum(r.accept_lengths)
                a["identical"] += r.output_ids == plain.output_ids
                a["runs"] += 1
    out = {}
    for s in steps:
        a = agg[s]
        if s == AUTO:
            assert policy is not None
            out[s] = {"accept_len": a["emitted"] / max(1, a["rounds"]), "speedup_decode": a["plain_decode"] / a["spec_decode"],
                      "speedup_e2e": a["plain"] / a["spec"], "identical": a["identical"], "runs": a["runs"],
                      "rounds": a["rounds"], **policy.to_dict()}
            log(f"S=auto (0..{args.max_steps}): rounds by S {out[s]['rounds_by_steps']} ({policy.probes} probes), "
                f"tokens per round {out[s]['accept_len']:.3f}, decode speedup x{out[s]['speedup_decode']:.3f} "
                f"(end to end x{out[s]['speedup_e2e']:.3f}); {lossless_line(a['identical'], a['runs'])}")
            continue
        components = s * costs["draft_step"] + costs["verify"][s + 1]
        # the unit here is the plain decode step as measured in these very runs (same prompts,
        # contexts and moment), so that AL / round cost reproduces the measured decode speedup
        plain_step = a["plain_decode"] / max(1, a["plain_steps"])
        per_round = a["spec_decode"] / max(1, a["rounds"]) / plain_step
        out[s] = {"accept_len": a["emitted"] / max(1, a["rounds"]), "speedup_decode": a["plain_decode"] / a["spec_decode"],
                  "speedup_e2e": a["plain"] / a["spec"], "round_cost": per_round,
                  "overhead": per_round - components, "identical": a["identical"], "runs": a["runs"],
                  "rounds": a["rounds"], "plain_step_seconds": plain_step}
        log(f"S={s}: acceptance length {out[s]['accept_len']:.3f}, decode speedup x{out[s]['speedup_decode']:.3f} "
            f"(end to end x{out[s]['speedup_e2e']:.3f}), round = {per_round:.2f} plain steps "
            f"({components:.2f} from the costs, overhead {out[s]['overhead']:.2f}; plain step here "
            f"{plain_step * 1e3:.1f} ms); {lossless_line(a['identical'], a['runs'])}")
    return out


# ------------------------------------------------------------------------------- precisions


SDPA_SUFFIX = "+sdpa"
"""A precision name ending in this runs the target's attention through plain SDPA instead of
row-exact attention (osprey_train/evaluation/row_exact_attention.py): the pre-fix baseline."""


def load_precision(p, target_dir: Path, drafter_dir: Path, draft_vocab_full: bool = False, row_exact: bool = True):
    """Target and drafter sessions in precision ``p`` (bf16: prepacked linears on CPU)."""
    from osprey_data.target_model import load_hf_target
    from osprey_train.evaluation.live_drafter import DrafterSession
    from osprey_train.evaluation.spec_decode import HFTargetSession
    from osprey_train.models import load_drafter

    model, tokenizer = load_hf_target(str(target_dir), device="cpu", dtype=p.weights)
    p.prepare(model)
    drafter = p.prepare(load_drafter(drafter_dir))
    target = HFTargetSession(model, drafter.config.tap_layers.layer_ids, row_exact=row_exact)
    if row_exact:
        with p.context():
            log(f"[{p.name}] verify rows: {target.make_rows_exact(VERIFY_MAX)['summary']}")
    vocab = model.get_output_embeddings().weight.shape[0]
    return target, DrafterSession(drafter, target_vocab_size=vocab)


def precision_section(args, names, target_dir: Path, drafter_dir: Path, prompts, eos, context_ids) -> dict:
    """Every precision side by side, interleaved: the cost table, plain and speculative decoding,
    losslessness within a precision and agreement with float32; ratios against the FASTEST plain
    decoding of the target over all precisions."""
    from osprey_data.target_model import resolve_precision
    from osprey_train.evaluation.spec_decode import plain_generate, speculative_generate

    precs = {n: resolve_precision(n.removesuffix(SDPA_SUFFIX), "cpu") for n in names}
    runs = {n: load_precision(precs[n], target_dir, drafter_dir, row_exact=not n.endswith(SDPA_SUFFIX))
            for n in names}
    steps = (3,) if args.quick else (2, 3, 4)
    ids = list(context_ids)
    base = len(ids) - 1
    filler = [ids[(3 * i + 1) % len(ids)] for i in range(VERIFY_MAX)]
    taps_of = {}
    for n, (target, session) in runs.items():
        with precs[n].context():
            target.reset(capacity=len(ids) + VERIFY_MAX)
            _, taps_of[n] = target.forward(ids[:-1], want_taps=True, logits_for=1)
            session.reset()
            session.propose(ids, taps_of[n], 1, 0.0, None)

    def measure(n: str, kind: str, k: int) -> float:
        target, session = runs[n]
        with precs[n].context():
            if kind == "draft":  # a round's state: one slot to extend, then k drafts
                session.slots -= 1
                session.attention.truncate(session.attention.length - 1)
                t = time.perf_counter()
                session.propose(ids, taps_of[n][-1:], k, 0.0, None)
                return time.perf_counter() - t
            block = [ids[-1], *filler[: k - 1]]
            t = time.perf_counter()
            target.forward(block, want_taps=kind == "verify", logits_for=None if kind == "verify" else 1)
            seconds = time.perf_counter() - t
            target.crop(base)
            return seconds

    verify_ns = (1, 2, 3, 4, 5, 6, 8, 16)
    order = [(n, kind, k) for n in names for kind, k in
             [("plain", 1), ("draft", 1), ("draft", 5)] + [("verify", v) for v in verify_ns]]
    for _ in range(2):
        for item in order:
            measure(*item)
    samples: dict[tuple, list[float]] = {}
    rng = random.Random(1)
    for _ in range(args.cost_repeats):
        rng.shuffle(order)
        for item in order:
            samples.setdefault(item, []).append(measure(*item))
    med = {k: statistics.median(v) for k, v in samples.items()}
    fastest_step = min(med[(n, "plain", 1)] for n in names)
    costs = {}
    for n in names:
        step = med[(n, "plain", 1)]
        costs[n] = {"plain_step_seconds": step, "plain_step_vs_fastest": step / fastest_step,
                    "plain_step_vs_fp32": step / med[(names[0], "plain", 1)],
                    "verify": {v: med[(n, "verify", v)] / step for v in verify_ns},
                    "draft_step": (med[(n, "draft", 5)] - med[(n, "draft", 1)]) / 4 / step}
    # decoding: per prompt, every precision in a rotated order; plain and each S
    agg = {n: {"plain_s": 0.0, "plain_tokens": 0, "agree_fp32": 0, **{s: {"s": 0.0, "tokens": 0, "rounds": 0,
               "emitted": 0, "identical": 0} for s in steps}} for n in names}
    ref_outputs: dict[int, list[int]] = {}
    warm = prompts[0]
    for n, (target, session) in runs.items():
        with precs[n].context():
            speculative_generate(target, session, warm, num_steps=3, max_new_tokens=8, eos_ids=eos)
            plain_generate(target, warm, max_new_tokens=8, eos_ids=eos)
    runs_count = 0
    for rep in range(args.spec_repeats):
        for i, p in enumerate(prompts):
            rot = (i + rep) % len(names)
            for n in names[rot:] + names[:rot]:
                target, session = runs[n]
                jobs = ["plain", *steps]
                if (i + rep) % 2:
                    jobs.reverse()
                out = {}
                with precs[n].context():
                    for job in jobs:
                        if job == "plain":
                            out[job] = plain_generate(target, p, max_new_tokens=args.max_new_tokens, eos_ids=eos)
                        else:
                            out[job] = speculative_generate(target, session, p, num_steps=job,
                                                            max_new_tokens=args.max_new_tokens, eos_ids=eos)
                a = agg[n]
                a["plain_s"] += out["plain"].seconds
                a["plain_tokens"] += len(out["plain"].output_ids)
                if n == names[0]:
                    ref_outputs[i] = out["plain"].output_ids
                for s in steps:
                    r, b = out[s], a[s]
                    b["s"] += r.seconds
                    b["tokens"] += len(r.output_ids)
                    b["rounds"] += len(r.accept_lengths)
                    b["emitted"] += sum(r.accept_lengths)
                    b["identical"] += r.output_ids == out["plain"].output_ids
                a.setdefault("_plain_out", {})[(rep, i)] = out["plain"].output_ids
            runs_count += 1
    for n in names:  # agreement with the float32 (first listed) plain outputs, after all runs
        agg[n]["agree_fp32"] = sum(o == ref_outputs[i] for (rep, i), o in agg[n].pop("_plain_out").items())
    fastest_plain = max(agg[n]["plain_tokens"] / agg[n]["plain_s"] for n in names)
    fastest_name = max(names, key=lambda n: agg[n]["plain_tokens"] / agg[n]["plain_s"])
    table = {}
    for n in names:
        a, c = agg[n], costs[n]
        plain_tok_s = a["plain_tokens"] / a["plain_s"]
        row = {**c, "plain_tok_s": plain_tok_s, "plain_vs_fastest": plain_tok_s / fastest_plain,
               "agree_fp32": a["agree_fp32"], "runs": runs_count, "spec": {}, "break_even": {}}
        for s in STEPS:  # cost model without the per-round overhead, in the fastest plain step
            row["break_even"][s] = (s * c["draft_step"] + c["verify"][s + 1]) * c["plain_step_vs_fastest"]
        for s in steps:
            b = a[s]
            tok_s = b["tokens"] / b["s"]
            row["spec"][s] = {"accept_len": b["emitted"] / max(1, b["rounds"]), "tok_s": tok_s,
                              "vs_own_plain": tok_s / plain_tok_s, "vs_fastest_plain": tok_s / fastest_plain,
                              "identical": b["identical"]}
        table[n] = row
        log(f"[{n}] plain step x{c['plain_step_vs_fp32']:.2f} of float32 ({c['plain_step_seconds'] * 1e3:.1f} ms), "
            f"verify(2/4/8/16) {c['verify'][2]:.2f}/{c['verify'][4]:.2f}/{c['verify'][8]:.2f}/{c['verify'][16]:.2f}, "
            f"draft step {c['draft_step']:.3f}; break-even AL vs the fastest plain step: "
            + ", ".join(f"S={s} {row['break_even'][s]:.2f}" for s in STEPS)
            + f"; plain {plain_tok_s:.1f} tok/s (x{row['plain_vs_fastest']:.2f} of the fastest); "
            + "; ".join(f"S={s} AL {v['accept_len']:.2f} x{v['vs_fastest_plain']:.2f} of the fastest plain, "
                        f"{lossless_line(v['identical'], runs_count)}" for s, v in row["spec"].items())
            + f"; plain outputs = float32's {a['agree_fp32']}/{runs_count}")
    return {"precisions": table, "fastest_plain": fastest_name, "fastest_plain_tok_s": fastest_plain,
            "spec_steps": list(steps)}


def precision_markdown(sweep: dict) -> list[str]:
    names = list(sweep["precisions"])
    steps = sweep["spec_steps"]
    t = sweep["precisions"]
    lines = ["## Precisions side by side (interleaved in this run)", "",
             "Costs in the precision's own one-token step; the step itself vs float32. Break-even AL = "
             "(S x draft step + verify(S+1)) x (step / fastest plain step): against the FASTEST plain decoding "
             f"(`{sweep['fastest_plain']}`), without the per-round overhead.", "",
             "| precision | 1-token step vs fp32 | verify 2 | 4 | 6 | 8 | 16 | drafter step | "
             + " | ".join(f"break-even S={s}" for s in STEPS) + " |",
             "|---|" + "---:|" * (7 + len(STEPS))]
    for n in names:
        r = t[n]
        lines.append(f"| {n} | {r['plain_step_vs_fp32']:.2f} | " + " | ".join(f"{r['verify'][v]:.2f}" for v in (2, 4, 6, 8, 16))
                     + f" | {r['draft_step']:.3f} | " + " | ".join(f"{r['break_even'][s]:.2f}" for s in STEPS) + " |")
    lines += ["", "Decoding (greedy, end to end): tokens/s as a multiple of the fastest plain decoding; "
              "`identical` = speculative output equals plain greedy output in the same precision; "
              "`= fp32` = plain output equals float32 plain output.", "",
              "| precision | plain | " + " | ".join(f"S={s} AL | S={s} speed | S={s} identical" for s in steps)
              + " | plain = fp32 |", "|---|---:|" + "---:|---:|---:|" * len(steps) + "---:|"]
    for n in names:
        r = t[n]
        lines.append(f"| {n} | {r['plain_vs_fastest']:.2f} | " + " | ".join(
            f"{v['accept_len']:.2f} | **{v['vs_fastest_plain']:.2f}** | {lossless_line(v['identical'], r['runs'])}"
            for v in r["spec"].values()) + f" | {r['agree_fp32']}/{r['runs']} |")
    return lines + [""]


# ------------------------------------------------------------------------------- model, report


def cost_model(costs: dict, overhead: float, device: str, drafter: str, target: str):
    """The measured costs as the project's CostModel (what ``osprey eval sweep --cost`` reads)."""
    from osprey_train.evaluation.cost_model import CostModel

    return CostModel(device=device, draft_step=round(costs["draft_step"], 4),
                     verify={n: round(v, 4) for n, v in costs["verify"].items()},
                     draft_step_by_width={k: round(v, 4) for k, v in costs["draft_step_by_width"].items()},
                     round_overhead=round(max(0.0, overhead), 4),
                     plain_step_seconds=round(costs["plain_step_seconds"], 6), drafter=drafter, target=target)


def break_even(cost, s: int) -> float:
    """AL*(S): the acceptance length at which a chain of S drafts decodes as fast as the target alone."""
    from osprey_train.evaluation.tree_shape import TreeShape

    return cost.round_cost(TreeShape.chain(s)) / cost.plain_step


def write_plot(path: Path, cost, spec: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in STEPS:
        be = break_even(cost, s)
        xs = [1 + (s * i) / 100 for i in range(101)]  # AL from 1 to S + 1
        line, = ax.plot(xs, [x / be for x in xs], label=f"S={s} (break-even AL {be:.2f})")
        if s in spec:
            ax.plot([spec[s]["accept_len"]], [spec[s]["speedup_decode"]], "o", color=line.get_color(),
                    markersize=8, markeredgecolor="black")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("acceptance length (tokens per verify round)")
    ax.set_ylabel("decode speedup over plain decoding")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(out: Path, summary: dict, costs: dict, spec: dict, overhead: float, cost, command: str) -> Path:
    lines = [f"# Live speculative decoding: costs and break-even ({summary['target']})", "",
             f"`{command}`", "",
             f"Device: {summary['device']}; load average {summary['load_avg']}; drafter: {summary['drafter']} "
             f"({summary['drafter_note']}).", "",
             "## Plain decoding: our harness vs `transformers` `generate` (greedy, batch 1)", "",
             "| | tokens/s | ratio |", "|---|---:|---:|",
             f"| `generate` | {summary['generate_tok_s']:.1f} | 1.00 |",
             f"| ours (`plain_generate`) | {summary['harness_tok_s']:.1f} | **{summary['harness_vs_generate']:.3f}** |", "",
             f"Identical outputs: {summary['identical']}/{summary['runs']}. Goal >= {GOAL_HARNESS}.", "",
             f"## Costs (plain decode step = 1 = {costs['plain_step_seconds'] * 1e3:.2f} ms, "
             f"context {costs['context']} tokens)", "",
             "| piece | cost |", "|---|---:|",
             f"| drafter step (draft vocabulary {summary['draft_vocab']}) | {costs['draft_step']:.3f} |",
             f"| drafter step, same drafter with a full-vocabulary head | {costs['draft_step_full_vocab']:.3f} |",
             *[f"| drafter step over {k} tree branches (one depth) | {v:.3f} |"
               for k, v in costs["draft_step_by_width"].items()],
             f"| drafter extend of one slot (beyond one step) | {costs['extend_one_slot']:.3f} |",
             *[f"| target forward of {n} tokens with taps (verify of S={n - 1}) | {costs['verify'][n]:.3f} |"
               for n in range(1, VERIFY_MAX + 1)],
             f"| per-round overhead (measured, median over S; the model takes max(0, this)) | {overhead:.3f} |", "",
             "## Break-even acceptance length and measured speedup", "",
             "AL*(S) = S x draft step + verify(S+1) + round overhead; predicted decode speedup = AL / AL*(S).", "",
             "A speedup over output that is not identical to plain decoding is marked NOT LOSSLESS and never "
             "counts.", "",
             "| S | break-even AL* | measured AL | predicted speedup | measured decode speedup | end to end | identical |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for s in STEPS:
        be = break_even(cost, s)
        if s in spec:
            m = spec[s]
            lines.append(f"| {s} | {be:.3f} | {m['accept_len']:.3f} | {m['accept_len'] / be:.3f} | "
                         f"{m['speedup_decode']:.3f} | {m['speedup_e2e']:.3f} | "
                         f"{lossless_line(m['identical'], m['runs'])} |")
        else:
            lines.append(f"| {s} | {be:.3f} | | | | | |")
    if AUTO in spec:
        m = spec[AUTO]
        lines.append(f"| auto (0..{m['max_steps']}) | | {m['accept_len']:.3f} (tokens per round) | | "
                     f"{m['speedup_decode']:.3f} | {m['speedup_e2e']:.3f} | {lossless_line(m['identical'], m['runs'])} |")
        lines += ["", f"`--steps auto` (as `osprey eval live` by default; costs {m['cost']['source']}): rounds per S "
                      f"{m['rounds_by_steps']}, {m['probes']} probe rounds; final acceptance estimate per position "
                      f"{m['acceptance_estimate']}."]
    lines += ["", f"Goal at S=3: AL* <= {GOAL_BREAK_EVEN_S3}. Plot: `live_bench.png` (curves: predicted; dots: measured).",
              ""]
    path = out / "live_bench.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="<= 60 s: tiny random Llama, S = 3 only, fewer repeats")
    ap.add_argument("--target", default=None, help="HF folder (default: SmolLM2-135M-Instruct; --quick: tiny)")
    ap.add_argument("--drafter", default=None, help="drafter folder (default: build one, cached in --work)")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="built drafter: convert --draft-vocab (default 8192; --quick 128; 0 = full vocabulary)")
    ap.add_argument("--distill-steps", type=int, default=None, help="built drafter: TTT steps (default 150; quick 20)")
    ap.add_argument("--train-prompts", type=int, default=None, help="built drafter: store prompts (default 64; quick 16)")
    ap.add_argument("--store-tokens", type=int, default=None, help="built drafter: response tokens (default 48; quick 24)")
    ap.add_argument("--prompts", type=int, default=None, help="held-out prompts decoded (default 5; quick 3)")
    ap.add_argument("--eval-prompts", default=None, metavar="FILE",
                    help="decode the first --prompts prompts of this conversation JSONL (round-robin across its "
                         "domains) instead of the demo's held-out prompts")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="tokens per prompt (default 64; quick 24)")
    ap.add_argument("--repeats", type=int, default=None, help="plain-vs-generate repeats (default 2; quick 3)")
    ap.add_argument("--cost-repeats", type=int, default=None, help="cost repeats (default 15; quick 10)")
    ap.add_argument("--spec-repeats", type=int, default=1, help="speculative-decoding repeats")
    ap.add_argument("--steps", default=None,
                    help="comma list of draft lengths decoded against plain decoding, each a number or 'auto' "
                         "(osprey eval live --steps auto: S chosen per round; default 1,2,3,4,5,auto; quick 3,auto)")
    ap.add_argument("--max-steps", type=int, default=5, help="--steps auto: the most drafts per round")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared box several OpenMP threads spin-wait for each other and "
                         "distort every figure; use 2 on an idle 2-core machine)")
    ap.add_argument("--work", default=None, help="cache of built models (default: $OSPREY_CACHE/live-bench)")
    ap.add_argument("--out", default="runs/live_bench", help="folder for live_bench.md / .png / .json")
    ap.add_argument("--cost-out", default=None, help="write the costs as an osprey-cost-model JSON file")
    ap.add_argument("--precisions", default=None,
                    help="comma list swept side by side, float32 first (default: float32,bfloat16,bf16-autocast on "
                         "a CPU with bf16 matrix units, else float32 only; 'none' skips the sweep); a name ending "
                         f"in {SDPA_SUFFIX!r} runs the target's attention as plain SDPA, not row-exact")
    ap.add_argument("--precision-only", action="store_true",
                    help="only the precision sweep (skips the float32 harness / cost / speculative sections)")
    args = ap.parse_args()
    defaults = dict(draft_vocab=(128, 8192), distill_steps=(20, 150), train_prompts=(16, 64), store_tokens=(24, 48),
                    prompts=(3, 5), max_new_tokens=(24, 64), repeats=(3, 2), cost_repeats=(10, 15))
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.steps is None:
        args.steps = "3,auto" if args.quick else "1,2,3,4,5,auto"
    try:
        args.steps = [AUTO if x.strip() == AUTO else int(x) for x in args.steps.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--steps: numbers in 1..{VERIFY_MAX - 1} or 'auto', got {args.steps!r}")
    if not args.steps or any(s != AUTO and not 1 <= s < VERIFY_MAX for s in args.steps) or \
            not 1 <= args.max_steps < VERIFY_MAX:
        ap.error(f"--steps / --max-steps: numbers in 1..{VERIFY_MAX - 1} or 'auto', got {args.steps!r}")

    import torch

    from osprey_data.atomic import write_json
    from osprey_data.conversation import stop_token_ids
    from osprey_data.target_model import load_hf_target
    from osprey_train.demo.fetch import cache_dir, fetch_smollm2
    from osprey_train.demo.pipeline import shipped_prompts, split_prompts
    from osprey_train.evaluation.live_drafter import DrafterSession
    from osprey_train.evaluation.live_prompts import load_prompts
    from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate
    from osprey_train.models import load_drafter
    from osprey_train.models.io import build_drafter

    from osprey_data.target_model import PRECISIONS, cpu_bf16_capable

    if args.precisions is None:
        names = ["float32", "bfloat16", "bf16-autocast"] if cpu_bf16_capable() else ["float32"]
    else:
        names = [] if args.precisions == "none" else [n.strip() for n in args.precisions.split(",") if n.strip()]
    bad = [n for n in names if n.removesuffix(SDPA_SUFFIX) not in PRECISIONS or n.startswith("auto")]
    if bad or (names and names[0] != "float32"):
        ap.error(f"--precisions: names from {PRECISIONS[1:]}, float32 first; got {args.precisions!r}")
    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    work = Path(args.work) if args.work else cache_dir() / "live-bench"
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.target:
        target_dir, target_name = Path(args.target), Path(args.target).name
    elif args.quick:
        target_dir, target_name = tiny_target(work), "tiny random Llama (8 x 256)"
    else:
        target_dir, target_name = fetch_smollm2(log=log), "SmolLM2-135M-Instruct"
    train_records, eval_records = split_prompts(shipped_prompts(), args.train_prompts, args.prompts)
    for name, records in (("train", train_records), ("eval", eval_records)):
        (work / f"{name}_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    eval_file = work / "eval_prompts.jsonl"
    if args.eval_prompts:
        eval_file = Path(args.eval_prompts)
        if not eval_file.is_file():
            ap.error(f"--eval-prompts: no file {eval_file}")
    if args.drafter:
        drafter_dir, note = Path(args.drafter), "given"
    else:
        drafter_dir = make_drafter(args, target_dir, work, work / "train_prompts.jsonl")
        note = (f"built here: target pruned to 2 blocks, no pre-training, convert --draft-vocab {args.draft_vocab}, "
                f"{args.distill_steps} TTT steps on {args.train_prompts} prompts x {args.store_tokens} tokens")
    t_setup = time.perf_counter() - start

    model, tokenizer = load_hf_target(str(target_dir), device="cpu")
    drafter = load_drafter(drafter_dir)
    cfg = drafter.config
    eos = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    prompts = [p.prompt_ids for p in load_prompts([str(eval_file)], tokenizer, limit=args.prompts)]
    target = HFTargetSession(model, cfg.tap_layers.layer_ids)
    log(f"verify rows: {target.make_rows_exact(VERIFY_MAX)['summary']}")
    vocab = model.get_output_embeddings().weight.shape[0]
    session = DrafterSession(drafter, target_vocab_size=vocab)
    torch.manual_seed(0)
    full_drafter = build_drafter(cfg.replace(draft_vocab_size=cfg.vocab_size)).eval()  # same shape, full head
    full_session = DrafterSession(full_drafter, target_vocab_size=vocab)
    device = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    log(f"target {target_name}; drafter {drafter_dir} ({cfg.num_layers} layers, draft vocabulary "
        f"{cfg.draft_vocab_size} of {cfg.vocab_size}); {len(prompts)} prompts x {args.max_new_tokens} tokens; {device}")

    context = prompts[0] + plain_generate(target, prompts[0], max_new_tokens=args.max_new_tokens).output_ids
    if args.precision_only:
        precision_main(args, names, target_dir, target_name, drafter_dir, note, prompts, eos, context, out,
                       device, start)
        return
    plain = plain_section(args, model, target, prompts, eos)
    costs = cost_section(args, target, session, full_session, context)
    spec = spec_section(args, target, session, prompts, eos, costs)
    fixed = [v for k, v in spec.items() if k != AUTO]
    overhead = statistics.median(v["overhead"] for v in fixed) if fixed else 0.0
    cost = cost_model(costs, overhead, device, str(drafter_dir), target_name)
    be = {s: break_even(cost, s) for s in STEPS}
    log("break-even acceptance length: " + ", ".join(f"S={s} {be[s]:.3f}" for s in STEPS)
        + f" (round overhead {overhead:.3f} plain steps; goal S=3 <= {GOAL_BREAK_EVEN_S3})")

    load = round(os.getloadavg()[0], 1)
    summary = {"target": target_name, "device": device, "load_avg": load, "drafter": str(drafter_dir),
               "eval_prompts": args.eval_prompts,
               "drafter_note": note, "draft_vocab": cfg.draft_vocab_size, **plain}
    command = "python benchmarks/live_bench.py " + " ".join(sys.argv[1:])
    md = write_report(out, summary, costs, spec, overhead, cost, command)
    png = out / "live_bench.png"
    write_plot(png, cost, spec, f"{target_name}, {device}; drafter: {cfg.num_layers} layers, "
                                f"draft vocab {cfg.draft_vocab_size}")
    doc = cost.to_dict()
    write_json(out / "live_bench.json", {"summary": summary, "costs": {**costs, "verify": doc["verify"],
                                                                       "draft_step_by_width": doc["draft_step_by_width"]},
                                          "round_overhead": overhead, "break_even": be,
                                          "speculative": {str(k): v for k, v in spec.items()}, "cost_model": doc})
    if args.cost_out:
        Path(args.cost_out).parent.mkdir(parents=True, exist_ok=True)
        cost.save(args.cost_out)  # validated against schemas/cost-model.v1.json
    s3 = spec.get(3, {})
    result = {
        "model": target_name.split(" ")[0], "threads": torch.get_num_threads(), "load_avg": load,
        "harness_vs_generate": round(plain["harness_vs_generate"], 3), "goal_harness": GOAL_HARNESS,
        "plain_step_ms": round(costs["plain_step_seconds"] * 1e3, 2), "draft_vocab": cfg.draft_vocab_size,
        "draft_step": round(costs["draft_step"], 3), "draft_step_full_vocab": round(costs["draft_step_full_vocab"], 3),
        "verify_2": round(costs["verify"][2], 3), "verify_4": round(costs["verify"][4], 3),
        "verify_6": round(costs["verify"][6], 3), "round_overhead": round(overhead, 3),
        **{f"break_even_s{s}": round(be[s], 3) for s in STEPS}, "goal_break_even_s3": GOAL_BREAK_EVEN_S3,
        "accept_len_s3": round(s3.get("accept_len", float("nan")), 3),
        "predicted_speedup_s3": round(s3.get("accept_len", float("nan")) / be[3], 3),
        "draft_step_w4": round(costs["draft_step_by_width"][4], 3),
        "speedup_decode_s3": round(s3.get("speedup_decode", float("nan")), 3),
        "speedup_e2e_s3": round(s3.get("speedup_e2e", float("nan")), 3),
        "identical_s3": f"{s3.get('identical')}/{s3.get('runs')}", "lossless_s3": s3.get("identical") == s3.get("runs"),
        **auto_result(spec.get(AUTO)),
        "setup_s": round(t_setup, 1), "seconds": round(time.perf_counter() - start, 1),
    }
    if names:
        sweep = precision_section(args, names, target_dir, drafter_dir, prompts, eos, context)
        result.update(sweep_result(sweep))
        with md.open("a", encoding="utf-8") as f:
            f.write("\n".join(["", *precision_markdown(sweep)]))
        doc = json.loads((out / "live_bench.json").read_text())
        write_json(out / "live_bench.json", {**doc, "precisions": sweep})
    log(f"report {md}, plot {png}" + (f", cost model {args.cost_out}" if args.cost_out else ""))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


def auto_result(auto: dict | None) -> dict:
    """RESULT keys of the --steps auto run: its speedups, losslessness and the rounds per S."""
    if auto is None:
        return {}
    return {"speedup_decode_auto": round(auto["speedup_decode"], 3), "speedup_e2e_auto": round(auto["speedup_e2e"], 3),
            "identical_auto": f"{auto['identical']}/{auto['runs']}", "lossless_auto": auto["identical"] == auto["runs"],
            "auto_rounds": "/".join(f"S{s}:{n}" for s, n in auto["rounds_by_steps"].items()),
            "auto_probes": auto["probes"]}


def sweep_result(sweep: dict) -> dict:
    """RESULT keys of the precision sweep: per precision the step vs float32, the break-even AL at
    S = 3 against the fastest plain decoding, and S = 3 speed / fastest plain decoding."""
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "bf16-autocast": "autocast"}
    out: dict = {"fastest_plain": sweep["fastest_plain"]}
    best = 0.0
    for n, r in sweep["precisions"].items():
        k = short[n.removesuffix(SDPA_SUFFIX)] + ("_sdpa" if n.endswith(SDPA_SUFFIX) else "")
        out[f"{k}_step_vs_fp32"] = round(r["plain_step_vs_fp32"], 3)
        out[f"{k}_break_even_s3"] = round(r["break_even"][3], 3)
        if 3 in r["spec"]:
            v = r["spec"][3]
            out[f"{k}_al_s3"] = round(v["accept_len"], 3)
            out[f"{k}_speedup_vs_fastest_s3"] = round(v["vs_fastest_plain"], 3)
            out[f"{k}_identical_s3"] = f"{v['identical']}/{r['runs']}"
            out[f"{k}_lossless_s3"] = v["identical"] == r["runs"]
            if v["identical"] == r["runs"]:   # a speedup over changed output never counts
                best = max(best, v["vs_fastest_plain"])
        out[f"{k}_plain_eq_fp32"] = f"{r['agree_fp32']}/{r['runs']}"
    out["best_speedup_vs_fastest_plain_s3"] = round(best, 3)
    out["best_break_even_s3"] = round(min(r["break_even"][3] for r in sweep["precisions"].values()), 3)
    return out


def precision_main(args, names, target_dir, target_name, drafter_dir, note, prompts, eos, context, out: Path,
                   device: str, start: float) -> None:
    """``--precision-only``: the sweep alone, with its own report and RESULT line."""
    from osprey_data.atomic import write_json

    if not names:
        raise SystemExit("--precision-only needs --precisions")
    sweep = precision_section(args, names, target_dir, drafter_dir, prompts, eos, context)
    load = round(os.getloadavg()[0], 1)
    command = "python benchmarks/live_bench.py " + " ".join(sys.argv[1:])
    md = out / "live_bench_precision.md"
    md.write_text("\n".join([f"# Live speculative decoding per precision ({target_name})", "", f"`{command}`", "",
                             f"Device: {device}; load average {load}; drafter: {drafter_dir} ({note}); "
                             f"{len(prompts)} prompts ({args.eval_prompts or 'the demo held-out prompts'}) x "
                             f"{args.max_new_tokens} tokens, {args.spec_repeats} repeat(s).",
                             "", *precision_markdown(sweep)]), encoding="utf-8")
    write_json(out / "live_bench_precision.json", {"load_avg": load, "device": device, "command": command,
                                                   "drafter": str(drafter_dir), "prompts": len(prompts),
                                                   "eval_prompts": args.eval_prompts,
                                                   "max_new_tokens": args.max_new_tokens, "precisions": sweep})
    result = {"model": target_name.split(" ")[0], "threads": args.threads, "load_avg": load, **sweep_result(sweep),
              "seconds": round(time.perf_counter() - start, 1)}
    log(f"report {md}")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()

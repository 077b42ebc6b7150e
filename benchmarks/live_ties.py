"""Where greedy speculative decoding departs from plain greedy decoding in one precision, and
whether each departure is a near-tie of the target's own logits.

In bfloat16 a k-row verify forward and a one-row plain step differ by about one bf16 ulp in
the attention (docs/live.md, "Losslessness per precision"), so where the target's top two
logits are (nearly) equal the two paths can pick different tokens and the continuations part.
For every prompt this runs plain and speculative decoding (chain, ``--steps``) in ``--precision``
and, at the first differing position, replays plain decoding step by step to read the target's
logits there: the gap ``logit[plain token] - logit[speculative token]`` (>= 0: plain took the
argmax), the speculative token's rank, and the bf16 spacing (ulp) at that logit's magnitude.
A gap of a few ulps means both continuations are greedy up to bf16 rounding; a large gap would
be a bug in verification.

Usage::

    python benchmarks/live_ties.py --drafter DIR --eval-prompts prompts.jsonl [--precision bfloat16]
    python benchmarks/live_ties.py --quick      # tiny random Llama + a tiny drafter, < 60 s (checks the script)

Ends with one ``RESULT key=value ...`` line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def bf16_ulp(x: float) -> float:
    """Spacing of bfloat16 numbers (8 significant bits) at magnitude ``|x|``."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


def quick_setup(work: Path) -> tuple[Path, Path, Path]:
    """A tiny random target, a drafter converted from it (2 blocks, untrained) and 4 prompts."""
    from osprey_train.stages.convert import ConvertConfig
    from osprey_train.stages.convert import run as convert
    from osprey_train.stages.prune import PruneConfig
    from osprey_train.stages.prune import run as prune
    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer
    from tests.helpers.tiny_store import make_tiny_store

    tok = make_tiny_tokenizer(work / "tok", vocab_size=512)
    target = make_tiny_llama(work / "target", tok, num_layers=4, hidden_size=128)
    store = make_tiny_store(work / "store", target, num_samples=8, max_new_tokens=8)
    prune(PruneConfig(source=str(target), layers=2, out=work / "backbone"))
    convert(ConvertConfig(backbone=work / "backbone", target=str(target), store=str(store), out=work / "init"))
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "conversations": [
        {"role": "user", "content": f"Count from {i} to {i + 9} and explain."}]}) + "\n" for i in range(4)))
    return Path(target), work / "init", prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--target", default=None, help="HF folder (default: SmolLM2-135M-Instruct from the demo cache)")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--eval-prompts", default=None, metavar="FILE", help="conversation JSONL of the prompts")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="drafts per round S")
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the per-prompt records as JSON here")
    args = ap.parse_args()

    import torch

    from osprey_data.conversation import stop_token_ids
    from osprey_data.target_model import load_hf_target, resolve_precision
    from osprey_train.evaluation.live_drafter import DrafterSession
    from osprey_train.evaluation.live_prompts import load_prompts
    from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate, speculative_generate
    from osprey_train.models import load_drafter

    torch.set_num_threads(args.threads)
    if args.quick:
        target_dir, drafter_dir, prompt_file = quick_setup(Path(tempfile.mkdtemp(prefix="live-ties-")))
        args.max_new_tokens = min(args.max_new_tokens, 24)
    else:
        if not (args.drafter and args.eval_prompts):
            ap.error("--drafter and --eval-prompts are required (or --quick)")
        from osprey_train.demo.fetch import fetch_smollm2

        target_dir = Path(args.target) if args.target else fetch_smollm2()
        drafter_dir, prompt_file = Path(args.drafter), Path(args.eval_prompts)
    prec = resolve_precision(args.precision, "cpu")
    model, tokenizer = load_hf_target(str(target_dir), device="cpu", dtype=prec.weights)
    prec.prepare(model)
    drafter = prec.prepare(load_drafter(drafter_dir))
    target = HFTargetSession(model, drafter.config.tap_layers.layer_ids)
    session = DrafterSession(drafter, target_vocab_size=model.get_output_embeddings().weight.shape[0])
    eos = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    prompts = load_prompts([str(prompt_file)], tokenizer, limit=args.prompts)

    records = []
    for p in prompts:
        with prec.context():
            plain = plain_generate(target, p.prompt_ids, max_new_tokens=args.max_new_tokens, eos_ids=eos).output_ids
            spec = speculative_generate(target, session, p.prompt_ids, num_steps=args.steps,
                                        max_new_tokens=args.max_new_tokens, eos_ids=eos).output_ids
        rec: dict = {"sample_id": p.sample_id, "identical": plain == spec, "tokens": len(plain)}
        k = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
        if k is not None:
            with prec.context():  # plain decoding replayed one row at a time up to position k
                target.reset(capacity=len(p.prompt_ids) + k + 1)
                logits_TV, _ = target.forward(p.prompt_ids, want_taps=False, logits_for=1)
                for token in plain[:k]:
                    logits_TV, _ = target.forward([token], want_taps=False, logits_for=1)
            row_V = logits_TV[-1]
            assert int(row_V.argmax()) == plain[k], "the replay must reproduce plain decoding"
            top = float(row_V[plain[k]])
            gap = top - float(row_V[spec[k]])
            rec.update(first_difference=k, gap=gap, ulp=bf16_ulp(top), gap_ulps=gap / bf16_ulp(top),
                       rank=int((row_V > row_V[spec[k]]).sum()),
                       second_gap=top - float(row_V.topk(2).values[1]))
        records.append(rec)
        print(json.dumps(rec), flush=True)
    departed = [r for r in records if not r["identical"]]
    if args.out:
        Path(args.out).write_text(json.dumps({"precision": prec.name, "steps": args.steps, "records": records},
                                             indent=2))
    result = {"precision": prec.name, "steps": args.steps, "prompts": len(records),
              "identical": sum(r["identical"] for r in records), "departed": len(departed),
              "max_gap_ulps": round(max((r["gap_ulps"] for r in departed), default=0.0), 2),
              "median_gap_ulps": round(statistics.median(r["gap_ulps"] for r in departed), 2) if departed else 0.0,
              "max_rank": max((r["rank"] for r in departed), default=0), "load_avg": round(os.getloadavg()[0], 1)}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()

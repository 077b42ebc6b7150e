"""Builder throughput against the bare target prefill on the same inputs, in the same run.

The builder (HF backend, CPU, teacher-forced so that both sides process exactly the same tokens)
renders, prefills with layer taps, takes top-k log-probs over the full softmax and writes the
store. The baseline is a plain ``model(input_ids, attention_mask)`` forward of the very token
sequences the builder stored, at the same batch size and padding, producing full logits — what
any feature extraction must at least pay. Goal: storing costs <= 15% over the bare forward.
A second baseline, the decoder stack without the LM head, shows the floor: the builder computes
the head only at real (unpadded) positions, which is why it can beat the plain full-logits forward.

Usage::

    python benchmarks/build_bench.py                       # tiny random Llama built on the fly
    python benchmarks/build_bench.py --model /work/models/smollm2-135m-instruct \\
        --inputs ../shared/data/prompts/chat.eval.jsonl --limit 32

Ends with one ``RESULT key=value ...`` line.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF model folder (default: tiny random Llama, built now)")
    ap.add_argument("--inputs", nargs="*", default=None, help="prompt files (default: synthetic prompts)")
    ap.add_argument("--limit", type=int, default=48, help="samples")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--hidden-codec", default="bf16")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared box, 2 OpenMP threads distort both sides)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each measurement (best is kept)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from osprey_data.builder import BuildConfig, run
    from osprey_data.store import StoreReader
    from osprey_data.target import load_hf_target

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.model is None:
            from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer

            tok = make_tiny_tokenizer(tmp / "tok", vocab_size=2048)
            model_dir = make_tiny_llama(tmp / "model", tok, num_layers=8, hidden_size=256)
            model_name = "tiny-llama-8x256"
        else:
            model_dir, model_name = Path(args.model), Path(args.model).name
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
    print(f"model {model_name}, {summary.samples_written} samples, {tokens} tokens, batch {args.batch_size}, "
          f"top-k {args.topk}, codec {args.hidden_codec}, {args.threads} threads")
    print(f"{'':28s}{'tokens/s':>12s}{'vs bare':>10s}")
    print(f"{'bare prefill (full logits)':28s}{bare_tps:12.1f}{1.0:10.2f}")
    body_tps = tokens / body_s
    print(f"{'decoder body only (no head)':28s}{body_tps:12.1f}{body_tps / bare_tps:10.2f}")
    print(f"{'builder (features + store)':28s}{build_tps:12.1f}{build_tps / bare_tps:10.2f}")
    print(f"storing overhead over bare forward: {overhead * 100:.1f}% (goal <= 15%); "
          f"{summary.bytes_per_token:.1f} bytes/token stored")
    print(f"RESULT model={model_name} samples={summary.samples_written} tokens={tokens} "
          f"bare_tok_s={bare_tps:.1f} builder_tok_s={build_tps:.1f} ratio={build_tps / bare_tps:.3f} "
          f"overhead={overhead:.3f} overhead_vs_body={body_tps / build_tps - 1.0:.3f} goal_overhead=0.15 bytes_per_token={summary.bytes_per_token:.1f}")


if __name__ == "__main__":
    main()

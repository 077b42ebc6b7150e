"""Greedy speculative decoding of the real SmolLM2-135M-Instruct is bit-identical to plain greedy
decoding (issue 37), on prompts of all five domains, in every precision the CPU runs:

- ``bfloat16``: this machine's kernels as they are (oneDNN, with AMX where the CPU has it);
- ``bfloat16-noamx``: oneDNN held to AVX512-BF16 (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``), as on
  a CPU with AVX512-BF16 but no AMX, where a one-row call takes another kernel than a block of rows
  (a user's outputs split from plain decoding there);
- ``float32``: MKL, where every verify row differs in bits from the one-row step unless shaped.

Two checks per run: the output tokens equal plain decoding's, and every verify row whose context is
plain decoding's (the rows that decide the output) has plain decoding's logits bit for bit
(:class:`RowLogits`). Without the linears' shaping (``make_exact`` skipped; measured here):
``bfloat16-noamx`` split 20 of the 30 prompts, at every S; ``float32`` split none, its near-ties
being rare, but 63 of the 64 compared rows of every run differed in bits (10 prompts checked),
which the second check catches.

The drafter is an "oracle with errors": it proposes the plain output's next tokens, each draft
corrupted with probability 0.3 by a seeded RNG, so that every acceptance length ``0..S`` occurs
(asserted) and verify blocks of every length ``2..S+1`` decide the output. EOS is ignored, so that
every prompt decodes its full ``NEW_TOKENS`` (a chat answer may end early; decoding past
``<|im_end|>`` is still the model's greedy decoding, and must stay exact there too).

Each precision runs in a subprocess of its own (this file, run as a script by the venv's
interpreter): the ISA limit must be set before torch starts, and every run gets the same
``THREADS`` threads whatever the test session uses. Skipped, with the reason, where the SmolLM2
cache (``osprey demo`` fills it) or ``../shared/data`` is missing; CI has both.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

# minutes of CPU: out of the README's `-m "not slow"` run, a CI step of its own (`-m real_model`)
pytestmark = [pytest.mark.real_model, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
PROMPTS = REPO.parent / "shared" / "data" / "prompts"
DOMAINS = ("chat", "code", "math", "finance", "commonsense")
PER_DOMAIN = 6
NEW_TOKENS = 64
STEPS = (2, 3, 5)
STEPS_OF = {"bfloat16": STEPS, "bfloat16-noamx": (2, 5), "float32": (3,)}
"""Draft steps per precision: all of STEPS in this machine's default precision, fewer in the other
two, so that the three runs fit a CI step of minutes (every S still runs in some precision)."""
THREADS = 2
CORRUPT = 0.3
NO_AMX = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}


class OracleWithErrors:
    """A drafter that proposes ``plain[k:k+S]`` after ``k`` generated tokens, each draft replaced by
    another token with probability ``corrupt`` (an RNG seeded by ``seed``): drafts past ``plain``'s
    end are arbitrary. Every acceptance length ``0..S`` then occurs when the target is lossless."""

    def __init__(self, plain: Sequence[int], prompt_len: int, vocab: int, seed: str, corrupt: float = CORRUPT):
        self.plain, self.prompt_len, self.vocab, self.corrupt = list(plain), prompt_len, vocab, corrupt
        self.rng = random.Random(seed)

    def reset(self) -> None:
        pass

    def propose(self, ids, new_taps_TLDt, num_steps, temperature, generator):
        done = len(ids) - self.prompt_len
        drafts = []
        for k in range(done, done + num_steps):
            true = self.plain[k] if k < len(self.plain) else 0
            if k >= len(self.plain) or self.rng.random() < self.corrupt:
                true = (true + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
            drafts.append(true)
        return drafts, None


class RowLogits:
    """Wraps ``target.forward`` and follows the sequence its cache holds: records the logits of
    every row of plain decoding by position (:meth:`record`), then, while speculative decoding runs
    (:meth:`check`), compares every row whose context is plain decoding's (a verify row of an
    accepted draft, or of the first rejected one) with plain decoding's logits there, bit for bit.
    Output tokens split only at near-ties; the rows' bits differ wherever the kernels do."""

    def __init__(self, target) -> None:
        self.target, self.inner = target, target.forward
        target.forward = self
        self.seq: list[int] = []
        self.reference: dict[int, Any] = {}
        self.full: list[int] | None = None  # None: recording
        self.compared, self.differ = 0, []

    def record(self) -> None:
        self.seq, self.reference, self.full = [], {}, None

    def check(self, full: Sequence[int]) -> None:
        self.seq, self.full, self.compared, self.differ = [], list(full), 0, []

    def __call__(self, ids, **kwargs):
        import torch

        start = self.target.length
        logits_TV, taps_TLDt = self.inner(ids, **kwargs)
        self.seq[start:] = [int(i) for i in ids]
        first = len(self.seq) - logits_TV.shape[0]
        for row, pos in enumerate(range(first, len(self.seq))):
            if self.full is None:
                self.reference[pos] = logits_TV[row].clone()
            elif pos in self.reference and self.seq[: pos + 1] == self.full[: pos + 1]:
                self.compared += 1
                if not torch.equal(logits_TV[row], self.reference[pos]):
                    self.differ.append(pos)
        return logits_TV, taps_TLDt


def smollm2_folder() -> Path | None:
    from osprey_data.target_model.fetch import cached_smollm2

    return cached_smollm2()


def prompt_files() -> list[Path]:
    return [PROMPTS / f"{domain}.eval.jsonl" for domain in DOMAINS]


def load_eval_prompts(tokenizer, per_domain: int):
    """``per_domain`` prompts of each domain, rendered; repeated ids (finance.eval.jsonl has one) are
    dropped, and only those."""
    from osprey_data.conversation.inputs import iter_inputs
    from osprey_train.evaluation.live_prompts import load_prompts

    dropped: list[str] = []
    samples = list(iter_inputs([str(p) for p in prompt_files()], on_error="skip",
                               error_sink=lambda rid, file, line, reason: dropped.append(f"{file}:{line}: {reason}")))
    unexpected = [d for d in dropped if "duplicate sample id" not in d]
    if unexpected:
        raise AssertionError(f"bad prompt records: {unexpected}")
    return load_prompts([], tokenizer, limit=per_domain * len(DOMAINS), samples=samples)


def onednn_isa_line() -> None:
    """Have oneDNN print the ISA it dispatches to (its verbose info line, on stdout): the test reads
    it to know that ``ONEDNN_MAX_CPU_ISA`` took effect."""
    import torch

    from osprey_data.target_model.precision import prepack_linears

    probe = torch.nn.Linear(64, 64).to(torch.bfloat16)
    prepack_linears(probe)
    with torch.no_grad(), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        probe(torch.ones(2, 64, dtype=torch.bfloat16))
    sys.stdout.flush()


ISA_LINE = "onednn_verbose,v1,info,cpu,isa:"


def run_precision(precision: str, out: Path, *, per_domain: int = PER_DOMAIN, new_tokens: int = NEW_TOKENS,
                  steps: Sequence[int] = STEPS, threads: int = THREADS) -> dict:
    """The subprocess' work: plain and speculative decoding of every prompt; writes ``out`` (JSON)."""
    import torch

    from osprey_data.conversation import use_chat_template
    from osprey_data.target_model import default_tap_layers, load_hf_target, resolve_precision
    from osprey_train.evaluation.live_report import first_divergence
    from osprey_train.evaluation.spec_decode import HFTargetSession, make_exact, plain_generate, speculative_generate

    torch.set_num_threads(threads)
    start = time.perf_counter()
    onednn_isa_line()
    prec = resolve_precision(precision.removesuffix("-noamx"), "cpu")
    model, tok = load_hf_target(str(smollm2_folder()), dtype=prec.weights)
    prec.prepare(model)
    use_chat_template(tok, None)
    prompts = load_eval_prompts(tok, per_domain)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    taps = default_tap_layers(model.config.num_hidden_layers).layer_ids
    target = HFTargetSession(model, taps)
    exactness = make_exact(target, max(steps) + 1, context=prec.context())
    setup = time.perf_counter() - start
    splits, accepted, runs, rows_differ, rows_compared = [], {str(s): set() for s in steps}, [], [], 0
    rows = RowLogits(target)
    with prec.context():
        for p in prompts:
            # EOS ignored: every prompt decodes new_tokens tokens (the module docstring says why)
            rows.record()
            plain = plain_generate(target, p.prompt_ids, max_new_tokens=new_tokens).output_ids
            for s in steps:
                drafter = OracleWithErrors(plain, len(p.prompt_ids), vocab, seed=f"{p.sample_id}:{s}")
                rows.check([*p.prompt_ids, *plain])
                spec = speculative_generate(target, drafter, p.prompt_ids, num_steps=s, max_new_tokens=new_tokens)
                rows_compared += rows.compared
                if rows.differ:
                    rows_differ.append({"S": s, "id": p.sample_id, "rows": len(rows.differ), "of": rows.compared,
                                        "first_position": rows.differ[0] - len(p.prompt_ids) + 1})
                accepted[str(s)].update(a for a, d in zip(spec.accepted, spec.drafted) if d == s)
                where = first_divergence(spec.output_ids, plain)
                runs.append({"id": p.sample_id, "domain": p.domain, "S": s, "tokens": len(spec.output_ids),
                             "rounds": len(spec.accept_lengths)})
                if where is not None:
                    splits.append({"precision": precision, "S": s, "id": p.sample_id, "domain": p.domain,
                                   "position": where, "prompt_tokens": len(p.prompt_ids),
                                   "spec": spec.output_ids[where: where + 1], "plain": plain[where: where + 1]})
    report = {"precision": precision, "isa_limit": os.environ.get("ONEDNN_MAX_CPU_ISA"),
              "threads": torch.get_num_threads(), "prompts": len(prompts),
              "domains": sorted({p.domain for p in prompts}), "exactness": exactness, "splits": splits,
              "rows_compared": rows_compared, "rows_differ": rows_differ,
              "accepted": {s: sorted(v) for s, v in accepted.items()}, "runs": len(runs),
              "min_tokens": min(r["tokens"] for r in runs), "setup_s": round(setup, 1),
              "seconds": round(time.perf_counter() - start, 1)}
    out.write_text(json.dumps(report, indent=1))
    return report


def _require_inputs() -> Path:
    missing = [str(p) for p in prompt_files() if not p.is_file()]
    if missing:
        pytest.skip(f"the shared prompt data is missing ({', '.join(missing)}): a checkout without ../shared/data")
    folder = smollm2_folder()
    if folder is None:
        pytest.skip("SmolLM2-135M-Instruct is not in the osprey cache ($OSPREY_CACHE or ~/.cache/osprey): "
                    "`osprey demo --quick` fetches it")
    return folder


@pytest.mark.parametrize("precision", ["bfloat16", "bfloat16-noamx", "float32"])
def test_speculative_equals_plain_on_smollm2(precision, tmp_path):
    _require_inputs()
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    if precision.endswith("-noamx"):
        env.update(NO_AMX)  # before torch starts: hence the subprocess
    env["OMP_NUM_THREADS"] = str(THREADS)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), precision, str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    report = json.loads(out.read_text())
    isa = [line.removeprefix(ISA_LINE) for line in proc.stdout.splitlines() if line.startswith(ISA_LINE)]
    report["onednn_isa"] = isa[0] if isa else None
    if precision.endswith("-noamx"):  # the emulation took effect: oneDNN dispatches below AMX
        assert isa and "AMX" not in isa[0], f"ONEDNN_MAX_CPU_ISA did not limit oneDNN: {isa}"
    print(json.dumps({k: report[k] for k in ("precision", "onednn_isa", "threads", "exactness", "seconds",
                                             "setup_s")}))
    assert report["prompts"] == PER_DOMAIN * len(DOMAINS) and report["domains"] == sorted(DOMAINS)
    assert report["min_tokens"] == NEW_TOKENS
    assert report["threads"] == THREADS
    problems = [f"S={s['S']} prompt {s['id']} ({s['domain']}): output split from plain decoding at generated "
                f"position {s['position']} (spec {s['spec']} vs plain {s['plain']})" for s in report["splits"]]
    problems += [f"S={r['S']} prompt {r['id']}: {r['rows']} of {r['of']} verify rows differ in bits from plain "
                 f"decoding's logits, the first predicting generated position {r['first_position']}"
                 for r in report["rows_differ"]]
    assert not problems, f"{precision} ({report['onednn_isa']}):\n" + "\n".join(problems)
    # every generated token was predicted by a row compared (the prefill's or a verify row)
    assert report["rows_compared"] >= report["runs"] * NEW_TOKENS, report["rows_compared"]
    for s in STEPS_OF[precision]:  # the drafter exercised every acceptance length, so every verify length decided tokens
        assert report["accepted"][str(s)] == list(range(s + 1)), (precision, s, report["accepted"][str(s)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="plain vs speculative decoding of SmolLM2 (one precision)")
    parser.add_argument("precision", choices=["bfloat16", "bfloat16-noamx", "float32"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-domain", type=int, default=PER_DOMAIN)
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    args = parser.parse_args(argv)
    report = run_precision(args.precision, args.out, per_domain=args.per_domain, new_tokens=args.new_tokens,
                           steps=STEPS_OF[args.precision])
    print(json.dumps({k: report[k] for k in ("precision", "seconds", "splits")}))


if __name__ == "__main__":
    main()

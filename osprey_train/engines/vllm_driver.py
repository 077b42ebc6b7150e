"""The script that runs inside the vLLM venv: greedy decoding of token-id prompts, vLLM's own counters.

Run as ``python -m osprey_train.engines.vllm_driver REQUEST.json RESULT.json`` by
:func:`osprey_train.engines.rig.run_driver`; of this package it imports only the standard-library
:mod:`driver_io` (the venv holds vLLM's pins, not ours), besides vLLM. The request names the target, the dtype,
the prompts (token ids, rendered on our side exactly as the store builder renders them), the
stop ids and the budget, and a list of *runs*: each run is one engine start (``LLM``) with or
without a speculative config. In each run the prompts are decoded one at a time (single stream:
the per-request counters are the difference of vLLM's cumulative counters around each request,
and tokens/s is single-stream speed), then once more all together (batched tokens/s).

Per request the result holds the output ids, the seconds, the finish reason and vLLM's spec-decode
counters as vLLM counts them (``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``): vLLM counts a draft accepted
when it matches the target's greedy token, before the output is cut at ``max_tokens`` or a stop
token, so the last round of a request can count drafts beyond the request's end
(:mod:`osprey_train.engines.compare` reconciles that).

Single-stream requests are decoded by stepping vLLM's engine here (``LLM.enqueue``, then
``llm_engine.step()`` until it is idle, as ``LLM.generate`` does) and reading the counters after
every step: with one request in flight a step that drafted is one verify round, so the result also
holds vLLM's accepted drafts **per round** (``accepted_per_round``), which our offline walk is
compared with round by round. A step that counted more than one round (it never should with one
request) leaves ``accepted_per_round`` out for that request rather than guessing. The seconds are
the steps' own; the counter reads between them are not timed.

vLLM's CPU workers are started with ``spawn``, which re-imports ``__main__``: everything happens
under the ``__main__`` guard at the bottom.
"""

from __future__ import annotations

import gc
import sys
import time

from osprey_train.engines.driver_io import serve

__all__ = ["main", "SPEC_COUNTERS"]

SPEC_COUNTERS = {"num_drafts": "vllm:spec_decode_num_drafts", "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
                 "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def _counters(llm, steps: int) -> dict:
    """vLLM's cumulative spec-decode counters (zeros before the first speculative step)."""
    out = {key: 0 for key in SPEC_COUNTERS}
    out["accepted_per_pos"] = [0] * steps
    for metric in llm.get_metrics():
        for key, name in SPEC_COUNTERS.items():
            if metric.name == name:
                out[key] += int(metric.value)
        if metric.name == PER_POS:
            for i, v in enumerate(metric.values[:steps]):
                out["accepted_per_pos"][i] += int(v)
    return out


def _delta(after: dict, before: dict) -> dict:
    return {k: ([a - b for a, b in zip(after[k], before[k])] if isinstance(after[k], list) else after[k] - before[k])
            for k in after}


def _decode_stepping(llm, prompt, params, steps: int) -> tuple:
    """One request decoded step by step: its output, the seconds of the steps, vLLM's counters for it
    and its accepted drafts per verify round (None when a step counted other than 0 or 1 rounds)."""
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests(), "single stream: nothing may be in flight before a request"
    llm.enqueue([prompt], params, use_tqdm=False)
    before = last = _counters(llm, steps)
    per_round: list[int] | None = []
    output, seconds = None, 0.0
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        step_outputs = engine.step()
        seconds += time.perf_counter() - t
        now = _counters(llm, steps)
        rounds = now["num_drafts"] - last["num_drafts"]
        if per_round is not None and rounds == 1:
            per_round.append(now["num_accepted_tokens"] - last["num_accepted_tokens"])
        elif rounds != 0:
            per_round = None
        last = now
        output = next((o for o in step_outputs if o.finished), output)
    assert output is not None, "the engine went idle without finishing the request"
    return output, seconds, _delta(last, before), per_round


def _one_run(run: dict, request: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = run.get("speculative")
    steps = int(spec["num_speculative_tokens"]) if spec else 0
    t0 = time.perf_counter()
    llm = LLM(model=request["target"], tokenizer=request["target"], dtype=request["dtype"], seed=0,
              max_model_len=int(request["max_model_len"]), max_num_seqs=max(len(request["prompts"]), 1),
              enforce_eager=True, disable_log_stats=False, speculative_config=spec,
              **request.get("engine_kwargs", {}))
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=int(request["max_tokens"]),
                            stop_token_ids=list(request["stop_token_ids"]), detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=list(p["prompt_ids"])) for p in request["prompts"]]
    # warm-up: first-call allocations would otherwise bias the first timing
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=steps + 2, detokenize=False),
                 use_tqdm=False)
    samples = []
    for p, prompt in zip(request["prompts"], prompts):
        out, seconds, counts, per_round = _decode_stepping(llm, prompt, params, steps)
        completion = out.outputs[0]
        samples.append({"id": p["id"], "output_ids": list(completion.token_ids), "seconds": seconds,
                        "finish_reason": completion.finish_reason, **counts,
                        **({"accepted_per_round": per_round} if spec and per_round is not None else {})})
    t = time.perf_counter()
    batched = llm.generate(prompts, params, use_tqdm=False)
    batched_s = time.perf_counter() - t
    batched_tokens = sum(len(o.outputs[0].token_ids) for o in batched)
    batched_same = [list(o.outputs[0].token_ids) == s["output_ids"] for o, s in zip(batched, samples)]
    del llm
    gc.collect()
    return {"name": run["name"], "speculative": spec, "load_s": load_s, "samples": samples,
            "batched": {"seconds": batched_s, "tokens": batched_tokens, "same_as_single": batched_same}}


def main(argv: list[str]) -> int:
    """Read the request, run every engine configuration in turn, write the result."""
    return serve(argv, engine="vllm", version_key="vllm_version", one_run=_one_run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

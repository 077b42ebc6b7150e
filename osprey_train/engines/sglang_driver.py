"""The script that runs inside the SGLang venv: greedy decoding of token-id prompts, SGLang's own counters.

Run as ``python -m osprey_train.engines.sglang_driver REQUEST.json RESULT.json`` by
:func:`osprey_train.engines.rig.run_driver`; like :mod:`vllm_driver` it imports only the standard
library, :mod:`driver_io` and SGLang, and reads the same request: the target, the dtype, the prompts as token ids,
the stop ids, the budget, the engine's keyword arguments (device, attention backend, ... chosen
on our side, :func:`osprey_train.engines.engine_eval.sglang_engine_kwargs`) and a list of *runs*,
each one ``sglang.Engine`` with or without ``speculative_*`` arguments. In each run the prompts are
decoded one at a time (single-stream speed), then all together (batched speed).

SGLang's counters are per request (``meta_info`` of each output, filled by its tokenizer manager
from the scheduler's ``Req``), in the batched pass too, so no cumulative metric is differenced:

- ``spec_verify_ct``: verify rounds of the request (one per decode step after the prefill);
- ``spec_accept_histogram`` (new name ``spec_correct_drafts_histogram``): entry ``k`` = rounds
  whose ``k`` first drafts matched the target's greedy tokens, the bonus token not counted;
  accepted drafts per position ``s`` = rounds with more than ``s`` (``SPEC_COUNTERS`` below);
- ``spec_num_correct_drafts``: their sum; ``completion_tokens``: the tokens returned.

Both fields are absent from ``meta_info`` when a request had no verify round (SGLang writes them
only when ``spec_verify_ct > 0``): zero rounds then. As in vLLM, SGLang's verify counts the drafts
matching the target before the output is cut at ``max_new_tokens`` or a stop token (its greedy
verify does not look at either), so the last round of a request can count drafts past its end;
:mod:`osprey_train.engines.compare` reconciles that.

With ``skip_tokenizer_init`` the ``output_ids`` run through the matched stop token at this
snapshot (the detokenizer, which trims it, is bypassed), as vLLM's and the store's ids do; the
driver asks for ``no_stop_trim`` too and puts the token back (``finish_reason.matched``) should a
version trim it while ``completion_tokens`` counts it.
"""

from __future__ import annotations

import signal
import sys
import time

from osprey_train.engines.driver_io import serve

__all__ = ["main", "per_request_counters"]


def per_request_counters(meta: dict, steps: int) -> dict:
    """One request's spec counters from SGLang's ``meta_info``, in the vLLM driver's keys."""
    hist = [int(v) for v in (meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram") or [])]
    rounds = int(meta.get("spec_verify_ct", 0))
    accepted = sum(k * n for k, n in enumerate(hist))
    return {"num_drafts": rounds, "num_draft_tokens": rounds * steps, "num_accepted_tokens": accepted,
            "accepted_per_pos": [sum(hist[s + 1:]) for s in range(steps)], "histogram": hist,
            "sglang_num_correct_drafts": meta.get("spec_num_correct_drafts"),
            "sglang_accept_length": meta.get("spec_accept_length")}


def _sample(prompt_id: str, out: dict, seconds: float, steps: int) -> dict:
    meta = out["meta_info"]
    ids = [int(t) for t in out["output_ids"]]
    reason = meta.get("finish_reason") or {}
    matched = reason.get("matched") if isinstance(reason, dict) else None
    if isinstance(matched, int) and int(meta.get("completion_tokens", len(ids))) == len(ids) + 1:
        ids.append(matched)  # a stop token trimmed from output_ids but counted
    return {"id": prompt_id, "output_ids": ids, "seconds": seconds, "completion_tokens": meta.get("completion_tokens"),
            "finish_reason": reason.get("type") if isinstance(reason, dict) else reason,
            **(per_request_counters(meta, steps) if steps else {})}


def _one_run(run: dict, request: dict) -> dict:
    import sglang

    spec = run.get("speculative") or {}
    steps = int(spec.get("speculative_num_steps", 0))
    t0 = time.perf_counter()
    # SIGQUIT ignored: SGLang's default handler (a failing child signals its parent) kills the
    # process tree; ignored, a failed start raises here and its message reaches the log
    engine = sglang.Engine(model_path=request["target"], skip_tokenizer_init=True, dtype=request["dtype"],
                           random_seed=0, context_length=int(request["max_model_len"]),
                           custom_sigquit_handler=signal.SIG_IGN, **request.get("engine_kwargs", {}), **spec)
    load_s = time.perf_counter() - t0
    try:
        params = {"max_new_tokens": int(request["max_tokens"]), "temperature": 0.0,
                  "stop_token_ids": list(request["stop_token_ids"]), "no_stop_trim": True}
        prompts = [list(p["prompt_ids"]) for p in request["prompts"]]
        # warm-up: first-call allocations would otherwise bias the first timing
        engine.generate(input_ids=prompts[:1], sampling_params={**params, "max_new_tokens": steps + 2})
        samples = []
        for p, ids in zip(request["prompts"], prompts):
            t = time.perf_counter()
            out = engine.generate(input_ids=[ids], sampling_params=params)[0]
            samples.append(_sample(p["id"], out, time.perf_counter() - t, steps))
        t = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        batched_s = time.perf_counter() - t
    finally:
        engine.shutdown()
    batched = [_sample(p["id"], o, batched_s, steps) for p, o in zip(request["prompts"], outs)]
    return {"name": run["name"], "speculative": spec or None, "load_s": load_s, "samples": samples,
            "batched": {"seconds": batched_s, "tokens": sum(len(b["output_ids"]) for b in batched),
                        "same_as_single": [b["output_ids"] == s["output_ids"] for b, s in zip(batched, samples)],
                        "samples": batched}}


def main(argv: list[str]) -> int:
    """Read the request, run every engine configuration in turn, write the result."""
    return serve(argv, engine="sglang", version_key="engine_version", one_run=_one_run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

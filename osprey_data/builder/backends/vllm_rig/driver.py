"""The long-lived process behind ``--backend vllm``: one vLLM engine answering generate/capture calls.

Started by :class:`osprey_data.builder.backends.vllm.VLLMBackend` as
``VENV/bin/python driver.py SETTINGS.json`` in the vLLM venv. It imports nothing of Osprey (the
venv holds vLLM's pins, not ours): the standard library, torch and safetensors at module top,
vLLM inside functions, so the pure helpers here are unit-tested without vLLM.

Protocol: one JSON object per line. The engine's settings come in ``SETTINGS.json``; calls come on
stdin, answers go to the original stdout, which is moved to a private descriptor at start so
that whatever vLLM prints lands in stderr (the backend's engine log), never in an answer. The
first answer says the engine is ready (or why not); every call gets exactly one answer, either
its result or ``{"error": "Type: message"}``.

* ``{"op": "generate", "requests": [{"prompt_ids", "seed"}], "max_tokens", "temperature", "top_p",
  "stop_token_ids"}`` -> ``{"results": [{"token_ids", "finish_reason", "stop_token_id"}]}``;
* ``{"op": "capture", "sequences": [[ids]], "out": DIR}`` -> ``{"files": [PATH]}``: a prefill of
  each sequence (``max_tokens=1``) with ``prompt_logprobs=K``; one safetensors file per sequence
  with ``hidden_TLD`` (the taps, the engine's precision), ``topk_ids_TK`` (int32) and
  ``topk_logprobs_TK`` (float32), written to DIR, read and deleted by the backend;
* ``{"op": "close"}`` -> ``{"closed": true}``, then exit.

Capture is vLLM's own: the ``extract_hidden_states`` speculative method with
``eagle_aux_hidden_state_layer_ids`` = our taps (vLLM's id i is the input of decoder layer i,
id 0 the embeddings: the HF ``hidden_states`` convention) stores the tapped states in a KV-cache
group, and the connector in ``osprey_sync_connector.py`` writes each finished request's states to
a file of its own under the capture folder; the driver reads and deletes it (and its lock file)
for generation and capture requests alike, so nothing accumulates. Top-k: vLLM's prompt
log-probs (full-softmax, raw logits) at positions 1..T-1 give rows 0..T-2; the one-token
completion's log-probs give the last row. Each carries the top-K entries (ranked by position)
plus the actual token at the rank vLLM counts for it; rows keep ranks 1..K (see
:func:`topk_row` for a tie of the actual token with the K-th).

Legend: T tokens, L taps, D hidden, K top-k.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
from safetensors.torch import load_file, save_file

__all__ = ["main", "topk_row", "completion_result", "cleanup_capture"]

CONNECTOR = "OspreySyncHiddenStatesConnector"
CONNECTOR_MODULE = "osprey_sync_connector"
_DRAIN_STEPS = 8  # idle engine steps allowed for the connector to write the last requests' files


def topk_row(entries: dict, k: int, where: str, actual: int | None = None) -> tuple[list[int], list[float]]:
    """Ids and log-probs of ranks 1..k from one vLLM position's ``{token_id: Logprob}``, by rank.

    vLLM ranks its top k by position (1..k) and adds the actual (prompt or sampled) token
    ``actual`` with the rank it counts itself (1 + the number of larger log-probs). Outside the
    top k that rank can still be <= k when it ties with the k-th (frequent in bf16): that entry
    is the extra one and goes. Anything short of ranks 1..k means too few log-probs were asked for.
    """
    kept = {int(tok): v for tok, v in entries.items() if v.rank is not None and int(v.rank) <= k}
    if len(kept) == k + 1 and actual is not None and int(actual) in kept:
        del kept[int(actual)]  # the tie outside the top k (inside it, vLLM keeps the positional rank)
    ranked = sorted((int(v.rank), tok, float(v.logprob)) for tok, v in kept.items())
    if [r for r, _, _ in ranked] != list(range(1, k + 1)):
        raise RuntimeError(f"{where}: vLLM returned ranks {[r for r, _, _ in ranked]} for top-{k} "
                           f"(max_logprobs too small?)")
    return [t for _, t, _ in ranked], [lp for _, _, lp in ranked]


def completion_result(token_ids: list[int], finish_reason: str | None, stop_reason, stop_ids: set[int]) -> dict:
    """Our GenerationResult fields from a vLLM completion: content ids, ``stop``/``length``, the stop id.

    vLLM keeps a matched stop token id (and the EOS) at the end of ``token_ids`` and names a
    matched ``stop_token_ids`` entry in ``stop_reason``; the stop token is not content.
    """
    ids = [int(t) for t in token_ids]
    if finish_reason == "length":
        return {"token_ids": ids, "finish_reason": "length", "stop_token_id": None}
    if finish_reason != "stop":
        raise RuntimeError(f"vLLM ended a request with finish_reason={finish_reason!r} (aborted or too long "
                           f"for max_model_len)")
    if ids and ids[-1] in stop_ids:
        return {"token_ids": ids[:-1], "finish_reason": "stop", "stop_token_id": ids[-1]}
    if isinstance(stop_reason, int) and stop_reason in stop_ids:
        return {"token_ids": ids, "finish_reason": "stop", "stop_token_id": int(stop_reason)}
    raise RuntimeError(f"vLLM stopped a request on {stop_reason!r}, which is none of the stop ids {sorted(stop_ids)}")


def cleanup_capture(path: str | None) -> None:
    """Delete a request's hidden-states file and its lock file (either may be absent)."""
    if not path:
        return
    for p in (path, path + ".lock"):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def _capture_path(out) -> str | None:
    params = getattr(out, "kv_transfer_params", None) or {}
    return params.get("hidden_states_path")


class Engine:
    """One ``vllm.LLM`` with hidden-state capture on the configured taps."""

    def __init__(self, settings: dict) -> None:
        from vllm import LLM

        torch.set_num_threads(int(settings.get("threads") or 1))
        self.taps = [int(t) for t in settings["taps"]]
        self.topk = int(settings["topk"])
        self.capture_dir = settings["capture_dir"]
        os.makedirs(self.capture_dir, exist_ok=True)
        # vLLM stacks the aux states in layer order; tap ids are strictly increasing (TapLayers), so
        # that is the requested order: anything else would permute the taps silently.
        if self.taps != sorted(set(self.taps)):
            raise ValueError(f"taps {self.taps} are not strictly increasing")
        self.llm = LLM(
            model=settings["target"], tokenizer=settings["target"], dtype=settings["dtype"],
            seed=int(settings.get("seed", 0)), max_model_len=int(settings["max_model_len"]),
            max_num_seqs=int(settings["max_num_seqs"]), enforce_eager=True, max_logprobs=self.topk,
            # a capture is a full prefill: cached prefix blocks would skip computing their states
            enable_prefix_caching=False,
            speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                "draft_model_config": {"hf_config": {
                                    "eagle_aux_hidden_state_layer_ids": self.taps}}},
            kv_transfer_config={"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE,
                                "kv_role": "kv_producer",
                                "kv_connector_extra_config": {"shared_storage_path": self.capture_dir}},
            **settings.get("engine_kwargs", {}))

    def _drain(self, outs: list) -> None:
        """Step the engine until every finished request's states are on disk.

        The connector saves a request's states in the engine step *after* the one that finished
        it (the scheduler hands the pending save to the worker with the next step's metadata),
        and ``LLM.generate`` returns before that step: a few idle steps flush them.
        """
        for _ in range(_DRAIN_STEPS):
            if all(os.path.isfile(p) for p in map(_capture_path, outs) if p):
                return
            self.llm.llm_engine.step()
        missing = [p for p in map(_capture_path, outs) if p and not os.path.isfile(p)]
        raise RuntimeError(f"vLLM wrote no hidden-states file for {len(missing)} requests after {_DRAIN_STEPS} "
                           f"steps (first: {missing[0]})")

    def generate(self, call: dict) -> dict:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        stop_ids = {int(t) for t in call["stop_token_ids"]}
        greedy = float(call["temperature"]) == 0.0
        params = [SamplingParams(max_tokens=int(call["max_tokens"]), temperature=float(call["temperature"]),
                                 top_p=1.0 if greedy else float(call["top_p"]), seed=None if greedy else int(r["seed"]),
                                 stop_token_ids=sorted(stop_ids), detokenize=False) for r in call["requests"]]
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in r["prompt_ids"]]) for r in call["requests"]]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        self._drain(outs)
        results = []
        for out in outs:
            cleanup_capture(_capture_path(out))  # the prompt's states, captured on the way: not wanted here
            c = out.outputs[0]
            results.append(completion_result(list(c.token_ids), c.finish_reason, c.stop_reason, stop_ids))
        return {"results": results}

    def capture(self, call: dict) -> dict:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        seqs = [[int(t) for t in s] for s in call["sequences"]]
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=self.topk, logprobs=self.topk,
                                detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params, use_tqdm=False)
        files = []
        try:
            self._drain(outs)
            for n, (seq, out) in enumerate(zip(seqs, outs)):
                path = _capture_path(out)
                if path is None or not os.path.isfile(path):
                    raise RuntimeError(f"sequence {n}: vLLM wrote no hidden-states file ({path!r})")
                data = load_file(path)
                cleanup_capture(path)
                T = len(seq)
                if data["token_ids"].tolist() != seq:
                    raise RuntimeError(f"sequence {n}: the captured states are of other tokens "
                                       f"({data['token_ids'].shape[0]} ids, want {T})")
                hidden_TLD = data["hidden_states"]
                if tuple(hidden_TLD.shape[:2]) != (T, len(self.taps)):
                    raise RuntimeError(f"sequence {n}: captured states of shape {tuple(hidden_TLD.shape)}, "
                                       f"want ({T}, {len(self.taps)}, D)")
                # row t: the distribution over token t+1 (the last one over the completion's token)
                rows = [out.prompt_logprobs[t] for t in range(1, T)] + [out.outputs[0].logprobs[0]]
                actual = seq[1:] + [out.outputs[0].token_ids[0]]
                ids, lps = zip(*(topk_row(r, self.topk, f"sequence {n} position {t}", actual[t])
                                 for t, r in enumerate(rows)))
                target = os.path.join(call["out"], f"capture-{n}.safetensors")
                save_file({"hidden_TLD": hidden_TLD, "topk_ids_TK": torch.tensor(ids, dtype=torch.int32),
                           "topk_logprobs_TK": torch.tensor(lps, dtype=torch.float32)}, target)
                files.append(target)
        finally:
            for out in outs:  # a failed batch leaves no capture files behind
                cleanup_capture(_capture_path(out))
        return {"files": files}


def main(argv: list[str]) -> int:
    """Serve calls from stdin until ``close`` or end of input."""
    # Answers get the original stdout; anything printed from here on goes to stderr (the log).
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(obj: dict) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    with open(argv[0], encoding="utf-8") as f:
        settings = json.load(f)
    t0 = time.perf_counter()
    try:
        import vllm
        from vllm.platforms import current_platform

        engine = Engine(settings)
    except Exception as exc:  # noqa: BLE001 - reported as one line, the traceback goes to the log
        traceback.print_exc()
        answer({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
        return 1
    answer({"ready": True, "vllm_version": vllm.__version__, "torch_version": torch.__version__,
            "device_type": str(current_platform.device_type), "load_s": time.perf_counter() - t0})
    for line in sys.stdin:
        if not line.strip():
            continue
        call = json.loads(line)
        if call.get("op") == "close":
            answer({"closed": True})
            break
        ops = {"generate": engine.generate, "capture": engine.capture}
        try:
            if call.get("op") not in ops:
                raise ValueError(f"unknown op {call.get('op')!r}; known: {sorted(ops)} and close")
            answer(ops[call["op"]](call))
        except Exception as exc:  # noqa: BLE001 - the backend raises it as one line
            traceback.print_exc()
            answer({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
    return 0


if __name__ == "__main__":  # vLLM may spawn workers, which re-import __main__
    sys.exit(main(sys.argv[1:]))

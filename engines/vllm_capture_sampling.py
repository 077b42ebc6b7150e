"""Why ``--backend vllm`` regenerates greedily only: temperature sampling with vLLM's capture path
on, against the plain engine, from the same seeds, in one run.

Two engines in turn on SmolLM2-135M-Instruct (float32, CPU): the builder's (``extract_hidden_states``
speculative method + our capture connector, exactly as ``vllm_rig/driver.py`` starts it) and a
plain ``LLM``. Each samples the same seeded prompts twice (temperature 1, top-p 0.95). Figures:
whether a rerun repeats itself, and the share of sampled tokens equal to the token before them
(the capture path's "draft" is the token just sampled; accepting it too often shows as repeats).

Runs **in the vLLM venv** (it imports vLLM), from the repository root::

    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \\
        .venv-vllm/bin/python engines/vllm_capture_sampling.py

Measured here (vLLM 0.32.0): ``RESULT capture_rerun_equal=False capture_repeats=0.59
plain_rerun_equal=True plain_repeats=0.00`` (the capture engine sampled ``[19556] * 12`` where the
plain one sampled ``[19556, 17, 15107, 230, ...]``). Ends with one ``RESULT key=value ...`` line. About 2 minutes here (two engine starts): a
correctness probe kept beside the vLLM rig, not a speed benchmark.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from pathlib import Path

RIG = Path(__file__).resolve().parents[1] / "osprey_data" / "builder" / "backends" / "vllm_rig"
sys.path.insert(0, str(RIG))
TARGET = Path("~/.cache/osprey/smollm2-135m-instruct").expanduser()  # fetched by `osprey demo`
PROMPTS = ["What is two plus two?", "Hello!", "Name a prime number."]


def repeats(runs: list[list[int]]) -> float:
    pairs = [(a, b) for r in runs for a, b in zip(r, r[1:])]
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


def main() -> int:
    from driver import Engine
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tok = AutoTokenizer.from_pretrained(TARGET)
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in PROMPTS]
    ids = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    call = {"requests": [{"prompt_ids": p, "seed": 11 + i} for i, p in enumerate(ids)], "max_tokens": 12,
            "temperature": 1.0, "top_p": 0.95, "stop_token_ids": [tok.eos_token_id]}
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine({"target": str(TARGET), "dtype": "float32", "taps": [2, 15, 27], "topk": 8,
                         "capture_dir": tmp, "max_model_len": 512, "max_num_seqs": 4})
        cap = [[r["token_ids"] for r in engine.generate(call)["results"]] for _ in range(2)]
        del engine
        gc.collect()
    llm = LLM(model=str(TARGET), dtype="float32", max_model_len=512, max_num_seqs=4, enforce_eager=True,
              enable_prefix_caching=False)
    params = [SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=11 + i, detokenize=False,
                             stop_token_ids=[tok.eos_token_id]) for i in range(len(ids))]
    prompts = [TokensPrompt(prompt_token_ids=p) for p in ids]
    plain = [[list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)] for _ in range(2)]
    for name, runs in (("capture", cap), ("plain", plain)):
        print(f"{name:8s} first run {runs[0]}\n{'':8s} rerun     {runs[1]}")
    print(f"RESULT capture_rerun_equal={cap[0] == cap[1]} capture_repeats={repeats(cap[0]):.2f} "
          f"plain_rerun_equal={plain[0] == plain[1]} plain_repeats={repeats(plain[0]):.2f}")
    return 0


if __name__ == "__main__":  # vLLM may spawn workers, which re-import __main__
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main())

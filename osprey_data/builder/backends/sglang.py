"""SGLang backend: SGLang's offline ``Engine`` generates; features come from a prefill on the GPU.

Regeneration dominates a build's cost (hundreds of sequential decode steps per sample), and that
is what SGLang's continuous batching, paged KV cache and CUDA graphs make fast. The engine is
driven with token ids only (``skip_tokenizer_init=True``) so the chat template, the stop tokens
and the loss mask stay exactly those of the HF backend.

Features (taps, top-k log-probs, final hidden) come from one batched prefill of the finished
sequences through the same code as the HF backend, loaded on the same GPU. Why not SGLang's
own hidden-state capture: reading SGLang's code (``LogitsProcessor._get_hidden_states_to_store``,
``ModelRunner.init_aux_hidden_state_capture``, the models' ``set_eagle3_layers_to_capture``), the
offline engine's ``return_hidden_states`` returns the *final* (post-norm) hidden state, and the
per-layer auxiliary capture is switched on only when an EAGLE-3 draft model is configured
(layer ids from the draft's ``eagle_config``), i.e. with speculative decoding running. There is
no public engine option to capture arbitrary layers without a draft, so using it would mean
patching SGLang internals that change from release to release. A prefill is compute-bound and
costs about one decode step per token, so this split keeps the store identical between backends
(one contract test) at a small cost.

What is verified: nothing here has run — SGLang is not installed on the development machines
and needs CUDA. The API used (``sglang.Engine(model_path=..., skip_tokenizer_init=True,
random_seed=..., mem_fraction_static=...)``, ``Engine.generate(input_ids=..., sampling_params=
[{"max_new_tokens", "temperature", "top_p", "stop_token_ids", "sampling_seed"}])`` returning
``output_ids`` and ``meta_info["finish_reason"]["type"]``, ``Engine.shutdown()``) was read from
SGLang's source and docs. The ``gpu``/``sglang``-marked contract test checks it where both exist.
``sampling_seed`` gives per-request seeds in recent SGLang; sampled tokens still depend on the
engine's kernels, so they match the HF backend only in distribution, not token for token.

SGLang is imported only when this backend is constructed, never at package import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from osprey_data.builder.backends.base import (
    GenerationRequest, GenerationResult, SamplingParams, SequenceFeatures, StepCallback, TargetBackend,
)
from osprey_data.builder.backends.hf import HFBackend
from osprey_data.errors import BackendUnavailableError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from osprey_data.builder.config import BuildConfig

__all__ = ["SGLangBackend", "sglang_available", "ENGINE_MEM_FRACTION"]

# GPU memory share of SGLang's static pool (weights + KV cache); the rest holds the prefill copy.
ENGINE_MEM_FRACTION = 0.55


def sglang_available() -> bool:
    """True when the ``sglang`` package can be imported and CUDA is present."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


class SGLangBackend(TargetBackend):
    """Generation with ``sglang.Engine``; features by prefill on the same CUDA device."""

    name = "sglang"

    def __init__(self, config: "BuildConfig") -> None:
        import torch

        try:
            import sglang
        except ImportError as exc:
            raise BackendUnavailableError(
                "--backend sglang needs the sglang extra: pip install -e '.[sglang]' in the Osprey checkout "
                "(CUDA only); or use --backend hf") from exc
        if not torch.cuda.is_available():
            raise BackendUnavailableError("--backend sglang needs a CUDA GPU; use --backend hf on CPU")
        if config.gguf_file is not None or config.target.endswith(".gguf"):
            raise ConfigError("--backend sglang loads HF folders only; convert the GGUF model or use --backend hf")
        if config.device == "cpu":
            raise ConfigError("--backend sglang runs on CUDA; drop --device cpu or use --backend hf")
        # The prefill model: tokenizer, identity, stop ids and features, exactly as the HF backend.
        self._prefill = HFBackend(config)
        self.tokenizer = self._prefill.tokenizer
        self.identity = self._prefill.identity
        self.precision = self._prefill.precision  # what the header records
        self.stop_ids = self._prefill.stop_ids
        gpu = int(str(self._prefill.device).split(":")[1]) if ":" in str(self._prefill.device) else 0
        dtype = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}[self.identity.dtype]
        self.engine: Any = sglang.Engine(
            model_path=config.target,
            skip_tokenizer_init=True,  # we send token ids and read token ids
            dtype=dtype,
            random_seed=config.seed,
            base_gpu_id=gpu,
            mem_fraction_static=ENGINE_MEM_FRACTION,
            log_level="error",
        )

    def generate(self, requests: list[GenerationRequest], params: SamplingParams, *,
                 on_step: StepCallback | None = None) -> list[GenerationResult]:
        if not requests:
            return []
        stop = sorted(self.stop_ids)
        sampling = [{
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop_token_ids": stop,
            "sampling_seed": r.seed % (2**31),
        } for r in requests]
        outputs = self.engine.generate(input_ids=[list(r.prompt_ids) for r in requests], sampling_params=sampling)
        results = []
        for out in outputs:
            ids = [int(t) for t in out["output_ids"]]
            kind = out["meta_info"]["finish_reason"]["type"]
            stop_id = None
            if kind == "stop":
                if ids and ids[-1] in self.stop_ids:  # the matched stop token is not content
                    stop_id = ids.pop()
                else:  # some versions leave the matched stop token out of output_ids
                    matched = out["meta_info"]["finish_reason"].get("matched")
                    stop_id = int(matched) if isinstance(matched, int) and matched in self.stop_ids else None
                reason = "stop"
            elif kind == "length":
                reason = "length"
            else:  # "abort": SGLang refused the request (e.g. too long for its context)
                raise BackendUnavailableError(f"SGLang aborted a request: {out['meta_info']['finish_reason']}")
            results.append(GenerationResult(token_ids=ids, finish_reason=reason, stop_token_id=stop_id))
        if on_step is not None:  # the engine answers the whole batch at once
            on_step(list(range(len(results))), sum(len(r.generated_ids) for r in results))
        return results

    def features(self, sequences: list[np.ndarray], *, taps: tuple[int, ...], topk: int,
                 final_hidden: bool) -> list[SequenceFeatures]:
        return self._prefill.features(sequences, taps=taps, topk=topk, final_hidden=final_hidden)

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.shutdown()
        if getattr(self, "_prefill", None) is not None:
            self._prefill.close()

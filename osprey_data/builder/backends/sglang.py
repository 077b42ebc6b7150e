"""SGLang backend: SGLang's offline ``Engine`` generates; features come from an HF prefill on the same device.

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

What is verified: on CPU, with the SGLang CPU rig (``.ci/sglang_venv.sh``), the shared
``BackendContract`` runs against this backend in bf16 (``pytest -m sglang_cpu`` in that venv):
greedy ids equal the HF backend's except at near-ties, features equal the HF backend's (they
are its prefill). SGLang's CPU engine runs bf16 only (its RMSNorm and AMX attention kernels have
no float32), so ``--device cpu`` refuses ``--dtype float32``/``float16`` and ``auto`` means
bfloat16 there, for the prefill too (one precision per store). On CUDA the engine options are
those read from SGLang's docs (``base_gpu_id``, ``mem_fraction_static``), untested here.
``sampling_seed`` gives per-request seeds in recent SGLang; sampled tokens still depend on the
engine's kernels, so they match the HF backend only in distribution, not token for token.

SGLang is imported only when this backend is constructed, never at package import.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from osprey_data.builder.backends.base import (
    GenerationRequest, GenerationResult, SamplingParams, SequenceFeatures, StepCallback, TargetBackend,
)
from osprey_data.builder.backends.hf import HFBackend
from osprey_data.errors import BackendUnavailableError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from osprey_data.builder.config import BuildConfig

__all__ = ["SGLangBackend", "sglang_available", "sglang_device", "ENGINE_MEM_FRACTION"]

# GPU memory share of SGLang's static pool (weights + KV cache); the rest holds the prefill copy.
ENGINE_MEM_FRACTION = 0.55


def sglang_device(device: str) -> str:
    """``auto`` is CUDA where present, else the CPU (SGLang's CPU engine)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sglang_available(device: str = "auto") -> bool:
    """True when ``sglang`` imports (with its kernels) and ``device`` can run it: CUDA present
    for ``cuda``; for ``cpu``, SGLang's CPU kernels (``sgl_kernel``'s CPU build)."""
    try:
        import torch

        dev = sglang_device(device)
        if dev.startswith("cuda") and not torch.cuda.is_available():
            return False
        if dev == "cpu":
            os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        import sglang  # noqa: F401
        import sgl_kernel  # noqa: F401
    except ImportError:
        return False
    return True


class SGLangBackend(TargetBackend):
    """Generation with ``sglang.Engine`` (CPU or CUDA); features by HF prefill on the same device."""

    name = "sglang"

    def __init__(self, config: "BuildConfig") -> None:
        import torch

        device = sglang_device(config.device)
        if config.gguf_file is not None or config.target.endswith(".gguf"):
            raise ConfigError("--backend sglang loads HF folders only; convert the GGUF model or use --backend hf")
        if device == "cpu":
            if config.dtype not in ("auto", "bfloat16"):
                raise ConfigError(f"--backend sglang --device cpu runs in bfloat16 only (SGLang's CPU kernels have "
                                  f"no {config.dtype}); pass --dtype bfloat16, or use --backend hf")
            # the prefill runs in the engine's precision too: one precision per store
            config = dataclasses.replace(config, device="cpu", dtype="bfloat16")
            os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # read when sglang is imported
        elif not device.startswith("cuda"):
            raise ConfigError(f"--backend sglang runs on cpu or cuda, got --device {config.device!r}")
        elif not torch.cuda.is_available():
            raise BackendUnavailableError(f"--device {config.device} needs a CUDA GPU; use --device cpu "
                                          f"(SGLang's CPU engine) or --backend hf")
        try:
            import sglang
        except ImportError as exc:
            raise BackendUnavailableError(
                "--backend sglang needs SGLang: pip install -e '.[sglang]' in the Osprey checkout on CUDA "
                "machines; on CPU, SGLang's CPU build (see .ci/sglang_venv.sh); or use --backend hf") from exc
        # The prefill model: tokenizer, identity, stop ids and features, exactly as the HF backend.
        self._prefill = HFBackend(config)
        self.tokenizer = self._prefill.tokenizer
        self.identity = self._prefill.identity
        self.precision = self._prefill.precision  # what the header records
        self.stop_ids = self._prefill.stop_ids
        dtype = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}[self.identity.dtype]
        kwargs: dict[str, Any] = dict(
            model_path=config.target,
            skip_tokenizer_init=True,  # we send token ids and read token ids
            dtype=dtype,
            random_seed=config.seed,
            log_level="error",
        )
        if device == "cpu":
            # SGLang's CPU engine: AMX attention, no overlap scheduler; a KV pool sized for one
            # batch (its default takes a share of the machine's RAM).
            kwargs.update(device="cpu", attention_backend="intel_amx", disable_overlap_schedule=True,
                          max_total_tokens=max(4096, config.batch_size * config.max_length))
        else:
            kwargs.update(base_gpu_id=int(device.split(":")[1]) if ":" in device else 0,
                          mem_fraction_static=ENGINE_MEM_FRACTION)
        self.engine: Any = sglang.Engine(**kwargs)

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

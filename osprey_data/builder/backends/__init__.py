"""Builder backends by name. Importing this package never imports SGLang or vLLM (both optional)."""

from __future__ import annotations

from osprey_data.builder.backends.base import (
    GenerationRequest, GenerationResult, SamplingParams, SequenceFeatures, TargetBackend, request_seed,
)
from osprey_data.builder.backends.hf import HFBackend
from osprey_data.builder.backends.sglang import SGLangBackend
from osprey_data.builder.backends.vllm import VLLMBackend
from osprey_data.builder.config import BACKEND_NAMES

__all__ = [
    "BACKENDS", "TargetBackend", "GenerationRequest", "GenerationResult", "SamplingParams",
    "SequenceFeatures", "request_seed", "HFBackend", "SGLangBackend", "VLLMBackend",
]

BACKENDS: dict[str, type[TargetBackend]] = {
    "hf": HFBackend,
    "sglang": SGLangBackend,
    "vllm": VLLMBackend,
}

assert tuple(BACKENDS) == BACKEND_NAMES, "builder/config.py BACKEND_NAMES must list every backend"

"""The one interface every builder backend implements (HF transformers, SGLang).

A backend owns the target model and answers two batched questions:

* :meth:`TargetBackend.generate` — continue each prompt (token ids) until a stop token or
  ``max_new_tokens``, greedily or by temperature/top-p sampling from a per-request seed;
* :meth:`TargetBackend.features` — for complete sequences, the tapped hidden states, the top-k
  next-token log-probs under the full softmax and optionally the final (post-norm) hidden state,
  one unpadded :class:`SequenceFeatures` per sequence.

Everything else (chat templates, masks, overflow, the store) is backend-independent and lives
in the runner, so both backends are checked by one contract test.

Legend: T tokens, L taps, D target hidden, K top-k.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    from osprey_data.builder.config import BuildConfig
    from osprey_data.target_model import TargetIdentity

__all__ = [
    "GenerationRequest", "GenerationResult", "SequenceFeatures", "SamplingParams", "TargetBackend",
    "request_seed", "StepCallback",
]

# Progress of one ``generate`` call: (indices of the requests that finished at this step, tokens
# generated at this step over all requests). Backends that decode step by step call it per step;
# others once at the end.
StepCallback = Callable[[list[int], int], None]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens: temperature 0 is greedy."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """Continue ``prompt_ids``; ``seed`` makes sampling independent of batch composition."""

    prompt_ids: tuple[int, ...]
    seed: int


@dataclass
class GenerationResult:
    """Generated ids (stop token excluded) and why generation ended (``stop`` | ``length``)."""

    token_ids: list[int]
    finish_reason: str
    stop_token_id: int | None = None
    """The stop token the target generated (``finish_reason == "stop"``), else None."""

    @property
    def generated_ids(self) -> list[int]:
        """Everything the target generated, verbatim: the content ids and the stop token, if any."""
        return self.token_ids + ([self.stop_token_id] if self.stop_token_id is not None else [])


@dataclass
class SequenceFeatures:
    """Target features of one sequence, unpadded."""

    hidden_TLD: Any
    """(T, L, D) tapped hidden states (torch tensor or numpy), HF hidden_states convention."""
    topk_ids_TK: np.ndarray
    """(T, K) int32: at position t, the top-k ids of the distribution over token t+1."""
    topk_logprobs_TK: np.ndarray
    """(T, K) float32 log-probs under the full softmax, descending."""
    final_hidden_TD: Any = None
    """(T, D) last hidden state after the final norm, or None."""


def request_seed(seed: int, sample_id: str, turn: int) -> int:
    """Per-(sample, turn) seed: the same sample samples the same tokens in any batch/worker."""
    digest = hashlib.sha256(f"{seed}:{sample_id}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


class TargetBackend(ABC):
    """A loaded target model that can generate and extract features in batches."""

    name: ClassVar[str]

    tokenizer: Any
    """The target's HF tokenizer (chat template, decoding)."""
    identity: "TargetIdentity"
    """Identity recorded in the store header."""
    stop_ids: frozenset[int]
    """Token ids that end generation (eos of tokenizer and generation config)."""

    @abstractmethod
    def __init__(self, config: "BuildConfig") -> None: ...

    @property
    def num_layers(self) -> int:
        return self.identity.num_layers

    @abstractmethod
    def generate(self, requests: list[GenerationRequest], params: SamplingParams, *,
                 on_step: StepCallback | None = None) -> list[GenerationResult]:
        """Continue every prompt; results in request order. ``on_step`` reports progress."""

    @abstractmethod
    def features(self, sequences: list[np.ndarray], *, taps: tuple[int, ...], topk: int,
                 final_hidden: bool) -> list[SequenceFeatures]:
        """Prefill complete sequences and return their features in order, unpadded."""

    def close(self) -> None:  # noqa: B027 - a no-op default; engines with workers override it
        """Release the model (engines with worker processes must shut them down)."""

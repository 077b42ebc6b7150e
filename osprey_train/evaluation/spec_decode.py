"""The speculative-decoding loop (chain drafting) and plain decoding, over one HF target.

The loop is written against two small interfaces so that the accept/reject logic can be tested
with stub drafters whose logits are fixed, and run for real with an Osprey or EAGLE-3 drafter
(:mod:`osprey_train.evaluation.live_drafter`):

- :class:`HFTargetSession` wraps a transformers causal LM with a ``DynamicCache``. Its cache
  always covers the committed tokens except the last one; a verify call feeds
  ``[last committed, d_1..d_S]`` and the cache is cropped back after acceptance.
- :class:`DraftSession` proposes ``S`` tokens given the committed ids and the target's tapped
  hidden states of the newly committed positions.

Rounds as SGLang runs them (and as offline acceptance counts them): the prefill of the whole
prompt yields the first response token, no draft involved; the drafter then extends over the
engine-layout slots (:mod:`osprey_train.ttt.layout`: slot ``q`` = ``(x_{q+1}, taps_q)`` at
position ``q``) and proposes; each verify round feeds ``[last committed, d_1..d_S]`` and emits
the accepted drafts plus one target token. ``accept_lengths`` holds the tokens emitted per verify
round, so ``acceptance length = sum(accept_lengths) / rounds`` = (generated tokens - 1) / rounds,
SGLang's ``spec_accept_length``.

Legend: T tokens, L taps, Dt target hidden, S draft steps, V target vocabulary.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from osprey_train.evaluation.verify import probs_from_logits, sample_from, verify_greedy, verify_sampling

__all__ = [
    "DraftSession",
    "HFTargetSession",
    "GenerationResult",
    "speculative_generate",
    "plain_generate",
    "prefill",
    "cut_emitted",
]


class DraftSession(Protocol):
    """A drafter bound to one sequence (its own KV cache)."""

    def reset(self) -> None:
        """Forget the previous sequence."""

    def propose(self, ids: Sequence[int], new_taps_TLDt: torch.Tensor, num_steps: int,
                temperature: float, generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        """Propose ``num_steps`` target-vocabulary ids following ``ids``.

        ``new_taps_TLDt`` are the target taps of the positions committed since the last call
        (positions ``len(ids_before) - 1 .. len(ids) - 2``; on the first call, right after the
        prefill and its first response token, ``0 .. len(ids) - 2``).
        Returns the drafts and, when ``temperature > 0``, the (S, V) distributions they were
        sampled from, over the target vocabulary.
        """


@dataclass
class GenerationResult:
    """One generated continuation and its verify-step statistics."""

    output_ids: list[int]
    """Generated token ids (prompt excluded), cut after EOS or at ``max_new_tokens``; the first
    one comes from the prefill."""
    accept_lengths: list[int] = field(default_factory=list)
    """Tokens emitted per verify round (accepted drafts + 1, cut by EOS or the budget); empty for
    plain decoding. Their sum is ``len(output_ids) - 1``."""
    drafted: list[int] = field(default_factory=list)
    """Drafts proposed per verify round (S, fewer near the token budget)."""
    accepted: list[int] = field(default_factory=list)
    """Drafts accepted per verify step (and emitted: an EOS or the budget can cut them)."""
    finish_reason: str = "length"
    """``"stop"`` when an EOS id was produced, else ``"length"``."""
    seconds: float = 0.0
    """Wall time of the generation, prefill included."""
    target_forwards: int = 0
    """Number of target forward passes (prefill included)."""

    def add_round(self, new_ids: list[int], *, drafted: int, accepted: int) -> None:
        """Record one verify round that emitted ``new_ids`` (already cut at EOS and the budget)."""
        self.output_ids.extend(new_ids)
        self.accept_lengths.append(len(new_ids))
        self.drafted.append(drafted)
        self.accepted.append(min(accepted, len(new_ids)))


def _has_sliding_layers(cache: Any) -> bool:
    return any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", []))


class HFTargetSession:
    """A transformers causal LM with a rollback-able KV cache and hidden-state taps."""

    def __init__(self, model: Any, tap_layers: Sequence[int] = ()) -> None:
        self.model = model
        self.tap_layers = tuple(int(i) for i in tap_layers)
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self.length = 0
        self.forwards = 0
        # transformers 5.x renamed ``past_key_values`` to ``cache``; accept both generations
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        # sliding-window layers (Gemma-3) drop old states unless told to keep them for rollback
        if _has_sliding_layers(self.cache) and hasattr(self.cache, "activate_past_recording"):
            self.cache.activate_past_recording()
        self.length = 0
        self.forwards = 0

    @torch.no_grad()
    def forward(self, ids: Sequence[int], *, want_taps: bool, positions: Sequence[int] | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``ids`` after the cached ones; return float32 logits (T, V) and taps (T, L, Dt).

        ``positions`` (default: consecutive after the cache) and a 4D additive ``attention_mask``
        over the cache and the new tokens serve tree verification (:mod:`tree_verify`).
        """
        num = len(ids)
        input_ids_BT = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        if positions is None:
            position_ids_BT = torch.arange(self.length, self.length + num, device=self.device)[None]
        else:
            position_ids_BT = torch.tensor([list(positions)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids_BT, position_ids=position_ids_BT, use_cache=True,
                         attention_mask=attention_mask, output_hidden_states=want_taps,
                         **{self._cache_kw: self.cache})
        # DynamicCache is updated in place; self.cache stays the live object
        self.length += num
        self.forwards += 1
        taps_TLDt = None
        if want_taps:
            taps_TLDt = torch.stack([out.hidden_states[i][0] for i in self.tap_layers], dim=1).float()
        return out.logits[0].float(), taps_TLDt

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached positions (roll back rejected drafts)."""
        remove = self.length - length
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {length}")
        if remove:
            self.cache.crop(-remove)  # transformers >= 5: negative = number of tokens to remove
            self.length = length


def _choose(logits_V: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits_V.argmax())
    return sample_from(probs_from_logits(logits_V, temperature), generator)


def cut_emitted(new_ids: list[int], eos_ids: frozenset[int], room: int) -> tuple[list[int], bool]:
    """Cut ``new_ids`` after the first EOS and to ``room`` tokens; say whether EOS was hit."""
    for i, token in enumerate(new_ids[:room]):
        if token in eos_ids:
            return new_ids[: i + 1], True
    return new_ids[:room], False


def prefill(target: HFTargetSession, drafter, prompt_ids: Sequence[int], *, eos: frozenset[int],
            temperature: float = 0.0, generator: torch.Generator | None = None,
            ) -> tuple[list[int], GenerationResult, torch.Tensor]:
    """Reset both sessions and prefill the prompt, as SGLang does before any verify round.

    Returns the committed ids (prompt + the first response token), the result so far and the
    target taps of every prompt position (what the drafter's first extend consumes).
    """
    if len(prompt_ids) < 1:
        raise ValueError("speculative decoding needs a non-empty prompt")
    target.reset()
    drafter.reset()
    ids = [int(i) for i in prompt_ids]
    logits_TV, taps_TLDt = target.forward(ids, want_taps=True)
    first = _choose(logits_TV[-1], temperature, generator)
    ids.append(first)
    result = GenerationResult(output_ids=[first])
    if first in eos:
        result.finish_reason = "stop"
    return ids, result, taps_TLDt


def speculative_generate(target: HFTargetSession, drafter: DraftSession, prompt_ids: Sequence[int], *,
                         num_steps: int, max_new_tokens: int, temperature: float = 0.0,
                         eos_ids: Sequence[int] = (), generator: torch.Generator | None = None) -> GenerationResult:
    """Generate with chain speculative decoding; greedy when ``temperature == 0``."""
    eos = frozenset(int(i) for i in eos_ids)
    start = time.perf_counter()
    ids, result, new_taps_TLDt = prefill(target, drafter, prompt_ids, eos=eos, temperature=temperature,
                                         generator=generator)
    while result.finish_reason != "stop" and len(result.output_ids) < max_new_tokens:
        room = max_new_tokens - len(result.output_ids)
        # drafts past the token budget could never be emitted: don't spend time on them
        steps = min(num_steps, room)
        drafts, draft_probs_SV = drafter.propose(ids, new_taps_TLDt, steps, temperature, generator) \
            if steps > 0 else ([], None)
        logits_SV, verify_taps_TLDt = target.forward([ids[-1], *drafts], want_taps=True)
        if temperature <= 0:
            accepted, next_id = verify_greedy(drafts, logits_SV)
        else:
            if draft_probs_SV is None:
                draft_probs_SV = logits_SV.new_zeros(0, logits_SV.shape[-1])
            accepted, next_id = verify_sampling(drafts, draft_probs_SV, probs_from_logits(logits_SV, temperature),
                                                generator)
        new_ids, stopped = cut_emitted([*drafts[:accepted], next_id], eos, room)
        ids.extend(new_ids)
        result.add_round(new_ids, drafted=len(drafts), accepted=accepted)
        target.crop(len(ids) - 1)
        new_taps_TLDt = verify_taps_TLDt[: len(new_ids)]
        if stopped:
            result.finish_reason = "stop"
            break
    result.seconds = time.perf_counter() - start
    result.target_forwards = target.forwards
    return result


def plain_generate(target: HFTargetSession, prompt_ids: Sequence[int], *, max_new_tokens: int,
                   temperature: float = 0.0, eos_ids: Sequence[int] = (),
                   generator: torch.Generator | None = None) -> GenerationResult:
    """Token-by-token decoding with the target alone (the baseline), KV-cached, no taps."""
    eos = frozenset(int(i) for i in eos_ids)
    start = time.perf_counter()
    target.reset()
    result = GenerationResult(output_ids=[])
    logits_TV, _ = target.forward([int(i) for i in prompt_ids], want_taps=False)
    while True:
        token = _choose(logits_TV[-1], temperature, generator)
        result.output_ids.append(token)
        if token in eos:
            result.finish_reason = "stop"
            break
        if len(result.output_ids) >= max_new_tokens:
            break
        logits_TV, _ = target.forward([token], want_taps=False)
    result.seconds = time.perf_counter() - start
    result.target_forwards = target.forwards
    return result

"""The speculative-decoding loop (chain drafting) and plain decoding, over one HF target.

The loop is written against two small interfaces so that the accept/reject logic can be tested
with stub drafters whose logits are fixed, and run for real with an Osprey or EAGLE-3 drafter
(:mod:`osprey_train.evaluation.live_drafter`):

- :class:`~osprey_train.evaluation.target_session.HFTargetSession` wraps a transformers causal LM
  with a KV cache that rolls back by length. Its cache always covers the committed tokens except
  the last one; a verify call feeds ``[last committed, d_1..d_S]`` and the cache is cropped back
  after acceptance.
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

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from osprey_train.evaluation.draft_length import DraftLengthPolicy
from osprey_train.evaluation.target_session import HFTargetSession
from osprey_train.evaluation.verify import probs_from_logits, sample_from, verify_greedy, verify_sampling

__all__ = [
    "DraftSession",
    "HFTargetSession",
    "GenerationResult",
    "speculative_generate",
    "plain_generate",
    "prefill",
    "cut_emitted",
    "make_exact",
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


def _choose(logits_V: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits_V.argmax())
    return sample_from(probs_from_logits(logits_V, temperature), generator)


def make_exact(target: HFTargetSession, max_rows: int, *, tree: bool = False, context: Any = None) -> dict[str, Any]:
    """Make ``target``'s verify blocks of up to ``max_rows`` rows row-exact and return what was
    established (:meth:`HFTargetSession.make_rows_exact`), for the report.

    ``tree``: tree verification feeds tree masks, whose rows row-exact attention does not cover
    (they go through SDPA); the linears are still shaped, and the result says the rows are not exact.
    ``context``: the precision's autocast context, entered around the check.
    """
    if not target.row_exact:
        return {"summary": "attention is not row-exact (not an SDPA target): greedy output may split from "
                           "plain decoding at ties"}
    with context if context is not None else contextlib.nullcontext():
        exactness = dict(target.make_rows_exact(max_rows))
    if tree:
        exactness["summary"] = ("tree-masked verify rows go through SDPA, not row-exact attention: greedy tree "
                                "decoding can split from plain decoding at near-ties (chain drafting is exact)")
        exactness["tree"] = True
    return exactness


def cut_emitted(new_ids: list[int], eos_ids: frozenset[int], room: int) -> tuple[list[int], bool]:
    """Cut ``new_ids`` after the first EOS and to ``room`` tokens; say whether EOS was hit."""
    for i, token in enumerate(new_ids[:room]):
        if token in eos_ids:
            return new_ids[: i + 1], True
    return new_ids[:room], False


def prefill(target: HFTargetSession, drafter, prompt_ids: Sequence[int], *, eos: frozenset[int],
            temperature: float = 0.0, generator: torch.Generator | None = None, capacity: int = 0,
            ) -> tuple[list[int], GenerationResult, torch.Tensor]:
    """Reset both sessions and prefill the prompt, as SGLang does before any verify round.

    Returns the committed ids (prompt + the first response token), the result so far and the
    target taps of every prompt position (what the drafter's first extend consumes).
    ``capacity``: positions to preallocate in the target's KV cache (it grows beyond if needed).
    """
    if len(prompt_ids) < 1:
        raise ValueError("speculative decoding needs a non-empty prompt")
    target.reset(capacity=capacity)
    drafter.reset()
    ids = [int(i) for i in prompt_ids]
    # the prefill gives the first response token and the taps of every prompt position
    logits_TV, taps_TLDt = target.forward(ids, want_taps=True, logits_for=1)
    first = _choose(logits_TV[-1], temperature, generator)
    ids.append(first)
    result = GenerationResult(output_ids=[first])
    if first in eos:
        result.finish_reason = "stop"
    return ids, result, taps_TLDt


def speculative_generate(target: HFTargetSession, drafter: DraftSession, prompt_ids: Sequence[int], *,
                         num_steps: int, max_new_tokens: int, temperature: float = 0.0,
                         eos_ids: Sequence[int] = (), generator: torch.Generator | None = None,
                         policy: DraftLengthPolicy | None = None) -> GenerationResult:
    """Generate with chain speculative decoding; greedy when ``temperature == 0``.

    ``num_steps`` drafts per round, or, with ``policy`` (``--steps auto``), as many as it chooses
    each round (``0 .. policy.max_steps``; ``num_steps`` is then only the cache's headroom). A round
    of 0 drafts is a plain step: the drafter is not called, and the taps of the positions it
    commits wait for the drafter's next call (:meth:`DraftSession.propose` takes the taps of every
    position committed since its last call), so the drafter stays in step with the sequence.
    """
    eos = frozenset(int(i) for i in eos_ids)
    start = time.perf_counter()
    most = num_steps if policy is None else max(num_steps, policy.max_steps)
    ids, result, new_taps_TLDt = prefill(target, drafter, prompt_ids, eos=eos, temperature=temperature,
                                         generator=generator, capacity=len(prompt_ids) + max_new_tokens + most + 1)
    pending_taps: list[torch.Tensor] = [new_taps_TLDt]   # committed positions the drafter has not seen yet
    while result.finish_reason != "stop" and len(result.output_ids) < max_new_tokens:
        room = max_new_tokens - len(result.output_ids)
        # drafts past the token budget could never be emitted: don't spend time on them
        steps = min(num_steps, room) if policy is None else policy.choose(room)
        if steps > 0:
            taps_TLDt = pending_taps[0] if len(pending_taps) == 1 else torch.cat(pending_taps)
            drafts, draft_probs_SV = drafter.propose(ids, taps_TLDt, steps, temperature, generator)
            pending_taps = []
        else:
            drafts, draft_probs_SV = [], None
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
        pending_taps.append(verify_taps_TLDt[: len(new_ids)])
        if policy is not None:
            policy.observe(len(drafts), accepted)
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
    target.reset(capacity=len(prompt_ids) + max_new_tokens)
    result = GenerationResult(output_ids=[])
    logits_TV, _ = target.forward([int(i) for i in prompt_ids], want_taps=False, logits_for=1)
    while True:
        token = _choose(logits_TV[-1], temperature, generator)
        result.output_ids.append(token)
        if token in eos:
            result.finish_reason = "stop"
            break
        if len(result.output_ids) >= max_new_tokens:
            break
        logits_TV, _ = target.forward([token], want_taps=False, logits_for=1)
    result.seconds = time.perf_counter() - start
    result.target_forwards = target.forwards
    return result

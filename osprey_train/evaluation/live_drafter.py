"""The incremental chain drafter: a real drafter (Osprey or EAGLE-3) bound to one sequence.

This is the one incremental drafter of the project (the live decoder's
:class:`~osprey_train.evaluation.spec_decode.DraftSession`); offline evaluation drafts every
round at once with :func:`~osprey_train.evaluation.chain_draft.draft_all_positions`, and the
tests check both give the same drafts. Chain drafting with a KV cache
(:class:`~osprey_train.models.KVCacheAttention`) in the engine layout of
:mod:`osprey_train.ttt.layout`, as SGLang runs it:

- draft extend: the slots committed since the last call are fed in one block, slot ``q`` with
  token ``x_{q+1}``, condition ``fuse_taps(c_q)`` (true target features) and position ``q``;
  after the prefill of a prompt of ``r`` tokens and its first response token ``x_r`` these are
  slots ``0 .. r-1``;
- drafting: the last slot's hidden state gives draft 1; each further step feeds the previous
  draft with the drafter's own previous pre-norm hidden state as condition, at the next position
  (as in Training-Time Test);
- rollback: the cache is truncated back to the committed slots, so the next extend replaces the
  self-conditioned entries with target-conditioned ones.

``tap_codec`` (``"bf16"`` / ``"fp8"``, the store's hidden codecs) rounds the live taps through that
codec first, so the drafter sees bit-for-bit what training and offline evaluation fed it from a
store; without it the drafter reads the target's float32 taps.

EAGLE-3 drafters (and Osprey drafters converted with ``--draft-vocab``) predict over a draft vocabulary; :class:`~osprey_train.ttt.loss.VocabMap` maps
their ids to target ids and scatters the draft distribution into the target vocabulary for
rejection sampling.

Legend: B batch (1), T slots, L taps, Dt target hidden, D drafter hidden, V vocabularies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from osprey_data.errors import ConfigError, ModelError
from osprey_data.store import HIDDEN_CODECS
from osprey_train.evaluation.verify import probs_from_logits, sample_from
from osprey_train.models import KVCacheAttention
from osprey_train.ttt.loss import VocabMap

__all__ = ["DrafterSession"]


class DrafterSession:
    """Binds a :class:`~osprey_train.models.Drafter` to one sequence being decoded."""

    def __init__(self, drafter, *, target_vocab_size: int | None = None, tap_codec: str | None = None) -> None:
        if tap_codec is not None and tap_codec not in HIDDEN_CODECS:
            raise ConfigError(f"unknown tap codec {tap_codec!r}; known: {sorted(HIDDEN_CODECS)}")
        self.codec = None if tap_codec is None else HIDDEN_CODECS[tap_codec]

        self.drafter = drafter.eval()
        self.config = drafter.config
        self.device = next(drafter.parameters()).device
        self.dtype = next(drafter.parameters()).dtype  # a bf16 drafter (--precision) reads bf16 taps
        self.target_vocab_size = int(target_vocab_size or self.config.vocab_size)
        d2t = drafter.draft_to_target
        if d2t is not None and int(d2t.max()) >= self.target_vocab_size:
            raise ModelError("drafter's draft_to_target maps to ids beyond the target vocabulary "
                             f"({int(d2t.max())} >= {self.target_vocab_size})")
        self.vocab = VocabMap.from_drafter(None if d2t is None else d2t.to(self.device), self.target_vocab_size)
        self._draft_to_target = None if d2t is None else d2t.tolist()  # one lookup per draft, no tensor
        self.attention = KVCacheAttention(self.config.num_layers)
        self.reset()

    def reset(self) -> None:
        self.attention.reset()  # keeps its buffers for the next sequence
        self.slots = 0  # slots in the cache with target conditions: slot q = (x_{q+1}, c_q)

    @torch.no_grad()
    def extend(self, ids: Sequence[int], new_taps_TLDt: torch.Tensor) -> torch.Tensor:
        """Draft extend: feed the slots committed since the last call; the last slot's hidden (1, 1, D)."""
        last_slot = len(ids) - 2  # slot of the last committed token x_{len(ids)-1}
        taps = new_taps_TLDt
        expected = last_slot + 1 - self.slots
        if taps.shape[0] != expected or expected < 1:
            raise ModelError(f"live drafter: got taps for {taps.shape[0]} positions, expected {expected} "
                             f"(positions {self.slots} .. {last_slot} of {len(ids)} committed tokens)")
        if self.codec is not None:
            taps = torch.from_numpy(self.codec.decode(self.codec.encode(taps.detach().float().cpu())))
        taps = taps.to(self.device, self.dtype)
        input_ids_BT = torch.tensor([list(ids[self.slots + 1: last_slot + 2])], dtype=torch.long,
                                    device=self.device)
        position_ids_BT = torch.arange(self.slots, last_slot + 1, device=self.device)[None]
        hidden_BTD = self.drafter.forward_hidden(input_ids_BT, self.drafter.fuse_taps(taps[None]),
                                                 position_ids_BT, self.attention)
        self.slots = last_slot + 1
        return hidden_BTD[:, -1:]

    @torch.no_grad()
    def propose(self, ids: Sequence[int], new_taps_TLDt: torch.Tensor, num_steps: int, temperature: float,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        prev_BTD = self.extend(ids, new_taps_TLDt)
        last_slot = self.slots - 1
        committed_cache = self.attention.length
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(num_steps):
            logits_V = self.drafter.logits(prev_BTD)[0, -1].float()
            if temperature <= 0:
                draft_id = int(logits_V.argmax())
            else:
                probs_V = probs_from_logits(logits_V, temperature)
                rows.append(self.vocab.to_target_probs(probs_V, self.target_vocab_size))
                draft_id = sample_from(probs_V, generator)
            token = draft_id if self._draft_to_target is None else self._draft_to_target[draft_id]
            drafts.append(token)
            if step + 1 == num_steps:
                break
            token_BT = torch.tensor([[token]], dtype=torch.long, device=self.device)
            position_BT = torch.tensor([[last_slot + 1 + step]], device=self.device)
            prev_BTD = self.drafter.forward_hidden(token_BT, prev_BTD, position_BT, self.attention)
        # drop the self-conditioned entries: the next extend re-feeds those slots with target taps
        self.attention.truncate(committed_cache)
        probs_SV = torch.stack(rows) if rows else None
        return drafts, probs_SV

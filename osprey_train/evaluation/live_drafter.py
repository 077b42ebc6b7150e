"""A real drafter (Osprey or EAGLE-3) as a :class:`~osprey_train.evaluation.spec_decode.DraftSession`.

Chain drafting with a KV cache (:class:`~osprey_train.models.KVCacheAttention`):

- catch-up: the positions committed since the last call are fed in one block, position ``t``
  with token ``x_t`` and condition ``fuse_taps(taps_{t-1})`` (true target features);
- drafting: the last hidden state gives draft 1; each further step feeds the previous draft with
  the drafter's own previous hidden state as condition (as in Training-Time Test);
- rollback: the cache is truncated back to the committed positions, so the next catch-up
  replaces the self-conditioned entries with target-conditioned ones.

Position 0 has no previous target feature: its condition is zeros (after ``fuse_taps``), the
convention of training and of the offline walk (:func:`~osprey_train.evaluation.chain_draft.
previous_conditions`), so live and offline drafts agree exactly.

``tap_codec`` (``"bf16"`` / ``"fp8"``, the store's hidden codecs) rounds the live taps through that
codec first, so the drafter sees bit-for-bit what training and offline evaluation fed it from a
store; without it the drafter reads the target's float32 taps.

EAGLE-3 drafters predict over a draft vocabulary; ``draft_to_target`` maps their ids to target
ids, and the draft distribution is scattered into the target vocabulary for rejection sampling.

Legend: B batch (1), T tokens, L taps, Dt target hidden, D drafter hidden, V vocabularies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from osprey_data.errors import ConfigError, ModelError
from osprey_data.store import HIDDEN_CODECS
from osprey_train.evaluation.verify import probs_from_logits, sample_from
from osprey_train.models import KVCacheAttention

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
        self.target_vocab_size = int(target_vocab_size or self.config.vocab_size)
        d2t = drafter.draft_to_target
        self.draft_to_target = None if d2t is None else d2t.to(self.device).long()
        if self.draft_to_target is not None and int(self.draft_to_target.max()) >= self.target_vocab_size:
            raise ModelError("drafter's draft_to_target maps to ids beyond the target vocabulary "
                             f"({int(self.draft_to_target.max())} >= {self.target_vocab_size})")
        self._attention_cls = KVCacheAttention
        self.reset()

    def reset(self) -> None:
        self.attention = self._attention_cls(self.config.num_layers)
        self.fed = 0  # next position to feed with a target condition

    def _to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.draft_to_target is None else self.draft_to_target[draft_ids]

    def _to_target_probs(self, probs_V: torch.Tensor) -> torch.Tensor:
        if self.draft_to_target is None:
            return probs_V
        full_V = probs_V.new_zeros(self.target_vocab_size)
        full_V[self.draft_to_target] = probs_V
        return full_V

    @torch.no_grad()
    def propose(self, ids: Sequence[int], new_taps_TLDt: torch.Tensor, num_steps: int, temperature: float,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        last = len(ids) - 1
        taps = new_taps_TLDt
        if self.codec is not None and taps.shape[0]:
            taps = torch.from_numpy(self.codec.decode(self.codec.encode(taps.detach().float().cpu())))
        taps = taps.to(self.device)
        # taps now cover positions max(fed-1, 0) .. last-1: the conditions of positions fed .. last
        expected = last - max(self.fed - 1, 0)
        if taps.shape[0] != expected:
            raise ModelError(f"live drafter: got taps for {taps.shape[0]} positions, expected {expected}")
        input_ids_BT = torch.tensor([list(ids[self.fed: last + 1])], dtype=torch.long, device=self.device)
        cond_BTD = self.drafter.fuse_taps(taps[None]) if taps.shape[0] else None
        if self.fed == 0:  # c_{-1} does not exist: zeros, as in training and offline acceptance
            zeros_BTD = torch.zeros(1, 1, self.config.hidden_size, device=self.device,
                                    dtype=next(self.drafter.parameters()).dtype)
            cond_BTD = zeros_BTD if cond_BTD is None else torch.cat([zeros_BTD, cond_BTD], dim=1)
        position_ids_BT = torch.arange(self.fed, last + 1, device=self.device)[None]
        hidden_BTD = self.drafter.forward_hidden(input_ids_BT, cond_BTD, position_ids_BT, self.attention)
        committed_cache = self.attention.length
        self.fed = last + 1

        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        prev_BTD = hidden_BTD[:, -1:]
        for step in range(num_steps):
            logits_V = self.drafter.logits(prev_BTD)[0, -1].float()
            if temperature <= 0:
                draft_id = int(logits_V.argmax())
            else:
                probs_V = probs_from_logits(logits_V, temperature)
                rows.append(self._to_target_probs(probs_V))
                draft_id = sample_from(probs_V, generator)
            token = int(self._to_target_ids(torch.tensor(draft_id, device=self.device)))
            drafts.append(token)
            if step + 1 == num_steps:
                break
            token_BT = torch.tensor([[token]], dtype=torch.long, device=self.device)
            position_BT = torch.tensor([[last + 1 + step]], device=self.device)
            prev_BTD = self.drafter.forward_hidden(token_BT, prev_BTD, position_BT, self.attention)
        # drop the self-conditioned entries: the next catch-up re-feeds those positions with target taps
        self.attention.truncate(committed_cache)
        probs_SV = torch.stack(rows) if rows else None
        return drafts, probs_SV

"""DFlash drafting: offline (every round of a stored sample at once) and live (one sequence, cached context).

A round that starts with ``x_0 .. x_a`` committed drafts with one block ``[x_a, mask x S]`` at
positions ``a .. a + S`` over the context of positions ``0 .. a - 1``: ``1 + S`` query slots, as
vLLM runs ``num_speculative_tokens = S`` (``S`` at most the trained ``block_size - 1``). The
drafts are the argmax of the mask slots (greedy), or samples of their softmax at ``T > 0``: each
slot's distribution depends on the committed context only, never on the drafts before it, so
rejection sampling against it is still exact.

- offline (:func:`draft_all_positions`, the ``offline_drafts`` hook): row ``a - 1`` holds the
  drafts of the round after ``x_0 .. x_a``, for every ``a`` of the sample, anchors in chunks;
- live (:class:`DFlashSession`, the ``live_session`` hook): the context keys and values of every
  layer are cached and extended by the taps of the newly committed positions each round, so a
  round costs one forward of ``1 + S`` slots.

Legend: T tokens, N anchors, P context positions, L taps, Dt target hidden, S drafts, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from osprey_data.errors import ConfigError, ModelError
from osprey_data.store import HIDDEN_CODECS
from osprey_train.evaluation.verify import probs_from_logits, sample_from

__all__ = ["draft_all_positions", "DFlashSession", "check_steps", "ANCHOR_CHUNK"]

ANCHOR_CHUNK = 128
"""Blocks drafted per forward offline (bounds the (blocks, heads, slots, context) score tensor)."""


def check_steps(drafter, steps: int) -> None:
    """Refuse more drafts per round than the trained block has mask slots."""
    most = drafter.block_size - 1
    if steps > most:
        raise ConfigError(f"dflash: --steps {steps} exceeds the drafter's block ({drafter.block_size} slots: at most "
                          f"{most} drafts per round); use --steps {most} or fewer")


@torch.no_grad()
def draft_all_positions(drafter, token_ids_T: torch.Tensor, hidden_TLDt: torch.Tensor, steps: int, *,
                        impl: str = "sdpa") -> torch.Tensor:
    """Greedy drafts (T - 1, S) of every verify round of one sample (``impl``: unused, one attention here)."""
    check_steps(drafter, steps)
    device = drafter.fc.weight.device
    token_ids_T = token_ids_T.to(device)
    hidden_TLDt = hidden_TLDt.to(device)
    anchors = torch.arange(1, int(token_ids_T.shape[0]), device=device)
    context = drafter.sequence_context(token_ids_T, hidden_TLDt)   # once: every chunk of blocks reads it
    rows = [drafter.context_block_logits(token_ids_T, context, anchors[i:i + ANCHOR_CHUNK], 1 + steps).argmax(-1)
            for i in range(0, anchors.numel(), ANCHOR_CHUNK)]
    if not rows:
        return torch.zeros(0, steps, dtype=torch.long, device=device)
    return torch.cat(rows)


class DFlashSession:
    """A DFlash drafter bound to one sequence in ``osprey eval live`` (the ``DraftSession`` protocol)."""

    def __init__(self, drafter, *, target_vocab_size: int | None = None, tap_codec: str | None = None) -> None:
        if tap_codec is not None and tap_codec not in HIDDEN_CODECS:
            raise ConfigError(f"unknown tap codec {tap_codec!r}; known: {sorted(HIDDEN_CODECS)}")
        self.codec = None if tap_codec is None else HIDDEN_CODECS[tap_codec]
        self.drafter = drafter.eval()
        self.device = drafter.fc.weight.device
        self.dtype = drafter.fc.weight.dtype
        vocab = int(target_vocab_size or drafter.config.vocab_size)
        if vocab != drafter.config.vocab_size:
            raise ModelError(f"live dflash drafter: it drafts over {drafter.config.vocab_size} tokens, the target has "
                             f"{vocab}")
        self.reset()

    @property
    def max_draft_steps(self) -> int:
        """The most drafts a round can have: the trained block's mask slots (``osprey eval live`` bounds S by it)."""
        return self.drafter.block_size - 1

    def reset(self) -> None:
        self.context: list[tuple[torch.Tensor, torch.Tensor]] = []   # per layer (k_HkPd, v_HkPd)
        self.length = 0   # context positions cached: 0 .. length - 1

    def _extend(self, new_taps_TLDt: torch.Tensor) -> None:
        taps = new_taps_TLDt
        if self.codec is not None:   # the taps as a store would have held them
            taps = torch.from_numpy(self.codec.decode(self.codec.encode(taps.detach().float().cpu())))
        taps = taps.to(self.device, self.dtype)
        positions = torch.arange(self.length, self.length + taps.shape[0], device=self.device)
        fresh = self.drafter.context(taps, positions)
        if not self.context:
            self.context = fresh
        else:
            self.context = [(torch.cat([k, k_new], dim=1), torch.cat([v, v_new], dim=1))
                            for (k, v), (k_new, v_new) in zip(self.context, fresh)]
        self.length += int(taps.shape[0])

    @torch.no_grad()
    def propose(self, ids: Sequence[int], new_taps_TLDt: torch.Tensor, num_steps: int, temperature: float,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        anchor = len(ids) - 1
        if self.length + new_taps_TLDt.shape[0] != anchor:
            raise ModelError(f"live dflash drafter: got taps for {new_taps_TLDt.shape[0]} positions, expected "
                             f"{anchor - self.length} (positions {self.length} .. {anchor - 1} of {len(ids)} "
                             "committed tokens)")
        if new_taps_TLDt.shape[0]:
            self._extend(new_taps_TLDt)
        if num_steps <= 0:
            return [], None
        check_steps(self.drafter, num_steps)
        anchors = torch.tensor([anchor], device=self.device)
        allowed = torch.ones(1, self.length, dtype=torch.bool, device=self.device)
        hidden = self.drafter.block_hidden(torch.tensor([int(ids[-1])], device=self.device), anchors, 1 + num_steps,
                                           self.context, allowed)
        logits_SV = self.drafter.logits(hidden[0, 1:]).float()
        if temperature <= 0:
            return logits_SV.argmax(-1).tolist(), None
        probs_SV = torch.stack([probs_from_logits(row, temperature) for row in logits_SV])
        return [sample_from(row, generator) for row in probs_SV], probs_SV

"""The engine layout: what each drafter slot of one document holds, in training and in serving.

A store sample is a token sequence ``x_0 .. x_{T-1}`` with the target's tapped hidden states
``c_0 .. c_{T-1}`` (``c_t`` has seen ``x_0..x_t``; the target predicts ``x_{t+1}`` from it) and
the target's next-token distribution at every position. The serving engines feed a drafter
with those states paired with the *next* token:

* SGLang's draft extend pairs ``h_0 .. h_{n-1}`` with the left-shifted ids
  ``[x_1 .. x_{n-1}, verified]`` at positions ``0 .. n-1``; vLLM and ``speculators`` shift the
  same way. No engine ever gives the drafter an ``(x_0, zeros)`` pair.

So slot ``p`` of a document (``p = 0 .. T-2``) holds **token** ``x_{p+1}``, **condition**
``fuse_taps(c_p)`` and **RoPE position** ``p``; its output predicts ``x_{p+2}``, which the
target's distribution stored at position ``p + 1`` describes. A document of ``T`` tokens has
``T - 1`` slots. Training (:mod:`osprey_train.distill_data.packing` and the TTT unroll), offline
drafting (:mod:`osprey_train.evaluation.chain_draft`) and live drafting
(:mod:`osprey_train.evaluation.live_drafter`) all use this layout; the function-preservation
property of a converted Osprey drafter therefore reads: slot ``p`` computes what the backbone
computes for the token sequence ``x_1 .. x_{p+1}`` at positions ``0 .. p``.

Loss mask: the store marks *tokens* (assistant content + end of turn). Slot ``p`` predicts
``x_{p+2}``, so it is scored when ``store.loss_mask[p + 2]`` is set: the first response token
``x_r`` is scored (predicted by slot ``r - 2`` from ``x_{r-1}``), and the last slot, whose next
token does not exist, never is.

Legend: T tokens of one document, P = T - 1 slots, L taps, Dt target hidden.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MIN_DOCUMENT_TOKENS", "num_slots", "slot_inputs", "slot_targets", "slot_loss_mask"]

MIN_DOCUMENT_TOKENS = 3
"""Fewest tokens a document needs for one scored slot (slot 0 predicting ``x_2``)."""


def num_slots(num_tokens: int) -> int:
    """Slots of a document of ``num_tokens`` tokens (0 for an empty one)."""
    return max(int(num_tokens) - 1, 0)


def slot_inputs(token_ids_T: Tensor, taps_TLDt: Tensor) -> tuple[Tensor, Tensor]:
    """Step-0 inputs of every slot: tokens ``x_1 .. x_{T-1}`` (P,) and taps ``c_0 .. c_{T-2}`` (P, L, Dt)."""
    return token_ids_T[1:], taps_TLDt[:-1]


def slot_targets(per_token_T: Tensor) -> Tensor:
    """Rows of the target's distribution each slot is scored against: positions ``1 .. T-1``."""
    return per_token_T[1:]


def slot_loss_mask(token_loss_mask_T: Tensor) -> Tensor:
    """``out[p] = token_loss_mask[p + 2]`` (bool, P), False at the last slot."""
    mask_T = torch.as_tensor(token_loss_mask_T).bool()
    out_P = torch.zeros(num_slots(mask_T.shape[0]), dtype=torch.bool)
    out_P[:-1] = mask_T[2:]
    return out_P

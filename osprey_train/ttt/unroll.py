"""The K-step Training-Time-Test unroll (EAGLE-3) and its loss ``sum_k decay^k CE_k``.

Indexing: the engine layout of :mod:`osprey_train.ttt.layout`, per document of a packed row.
``x`` are the store's tokens, ``c_t`` the target taps at store position ``t``; slot ``p`` of a
document holds what the packer put there:

* step 0, slot ``p``: token ``x_{p+1}``, condition ``fuse_taps(c_p)``, position ``p``; predicts
  ``x_{p+2}`` against the target's distribution stored at ``p + 1`` (the packed row's target at
  slot ``p``). Its output hidden ``h^0_p`` (before the final norm) stands in for the target's
  state at the next position.
* step k >= 1, slot ``p``: token ``x_{p+1+k}`` (teacher forced: the packed token of slot
  ``p + k``), condition ``h^{k-1}_p`` (the drafter's own step-(k-1) hidden of the same chain),
  position ``p + k``; predicts ``x_{p+k+2}`` against the packed target of slot ``p + k``;
  attends to step-0 keys at slots ``<= p`` and to its own chain's keys of steps ``1..k``. Slots
  whose ``p + k`` leaves the document are invalid (their loss mask is 0; they only ever attend
  to themselves and the valid prefix).

This is exactly what chain speculative decoding computes in SGLang after committing
``x_0 .. x_{p+1}`` when the first ``k`` drafted tokens are right; ``tests/train/ttt/test_unroll.py``
checks it against an explicit incremental decode per slot, and the interop tests against the
``speculators`` package's own TTT forward.

``PackedBatch.loss_mask_BT[p]`` marks slot ``p``'s step-0 prediction as scored (the packer takes
it from ``store.loss_mask[p + 2]``); step ``k`` of slot ``p`` is scored by ``loss_mask[p + k]``.

Legend: B batch, T slots, L taps, Dt target hidden, D drafter hidden, K top-k, S steps.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from osprey_data.errors import ConfigError
from osprey_train.ttt.attention import TTTAttention
from osprey_train.ttt.loss import DEFAULT_TARGET_DIST, TargetRows, VocabMap, chunked_distill_ce

__all__ = ["PackedBatch", "TTTOutput", "shift_left", "step_valid", "ttt_hidden_states", "ttt_loss"]


@dataclass
class PackedBatch:
    """Packed samples in the engine layout: one or more documents per row, no padding inside a row.

    Per slot: ``input_ids`` (token ``x_{p+1}``), ``taps`` (``c_p``), ``position_ids`` (``p`` within
    its document), ``doc_ids``, ``loss_mask`` (the step-0 prediction is scored) and the target
    side (top-k ids/log-probs or final hidden) of the token the slot predicts.
    """

    input_ids_BT: Tensor
    doc_ids_BT: Tensor
    position_ids_BT: Tensor
    taps_BTLDt: Tensor
    loss_mask_BT: Tensor
    topk_ids_BTK: Tensor | None = None
    topk_logprobs_BTK: Tensor | None = None
    final_hidden_BTDt: Tensor | None = None

    def to(self, device) -> "PackedBatch":
        return PackedBatch(**{f.name: None if getattr(self, f.name) is None
                              else getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids_BT.numel())


@dataclass
class TTTOutput:
    loss: Tensor
    metrics: dict[str, float]


def shift_left(x: Tensor, k: int, fill) -> Tensor:
    """``out[:, t] = x[:, t + k]`` along dim 1, ``fill`` past the end."""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)


def step_valid(doc_ids_BT: Tensor, k: int) -> Tensor:
    """Slots whose step-k token ``t + k`` is inside the same document."""
    return shift_left(doc_ids_BT, k, -1) == doc_ids_BT


def ttt_hidden_states(drafter, input_ids_BT: Tensor, cond0_BTD: Tensor, position_ids_BT: Tensor,
                      doc_ids_BT: Tensor, steps: int, *, impl: str = "sdpa",
                      next_tokens: Callable[[int, Tensor], Tensor] | None = None,
                      checkpoint_steps: bool = False, on_step: Callable | None = None) -> list[Tensor]:
    """Run steps ``0..steps-1`` and return each step's hidden (B, T, D) (before the final norm).

    ``cond0_BTD`` is the step-0 condition (``drafter.fuse_taps`` of the slots' taps).
    ``next_tokens(k, hidden_prev)`` gives the step-k input tokens; default: teacher forcing
    (the token of slot ``p + k``, pad 0 past the document). ``on_step(k, hidden)`` is called after each step
    (e.g. to score it and free it early).
    """
    attn = TTTAttention(doc_ids_BT, impl=impl)
    hiddens: list[Tensor] = []
    cond_BTD = cond0_BTD
    for k in range(steps):
        if k == 0:
            ids_BT = input_ids_BT
        elif next_tokens is not None:
            ids_BT = next_tokens(k, hiddens[-1])
        else:
            ids_BT = torch.where(step_valid(doc_ids_BT, k), shift_left(input_ids_BT, k, 0),
                                 torch.zeros_like(input_ids_BT))
        pos_BT = position_ids_BT + k
        backend = attn.at_step(k)
        if checkpoint_steps and torch.is_grad_enabled():
            h_BTD = checkpoint(drafter.forward_hidden, ids_BT, cond_BTD, pos_BT, backend,
                               use_reentrant=False)
        else:
            h_BTD = drafter.forward_hidden(ids_BT, cond_BTD, pos_BT, backend)
        hiddens.append(h_BTD)
        if on_step is not None:
            on_step(k, h_BTD)
        cond_BTD = h_BTD
    return hiddens


def _target_rows(batch: PackedBatch, flat_idx: Tensor) -> TargetRows:
    def pick(x):
        return None if x is None else x.reshape(-1, *x.shape[2:])[flat_idx]

    return TargetRows(topk_ids_NK=pick(batch.topk_ids_BTK), topk_logprobs_NK=pick(batch.topk_logprobs_BTK),
                      final_hidden_NDt=pick(batch.final_hidden_BTDt))


def ttt_loss(drafter, batch: PackedBatch, *, steps: int = 5, decay: float = 0.8,
             target_dist: str = DEFAULT_TARGET_DIST, impl: str = "sdpa", chunk_size: int = 1024,
             target_head: Callable | None = None, vmap: VocabMap | None = None,
             checkpoint_steps: bool = False, score_out_of_vocab: bool = False) -> TTTOutput:
    """``sum_k decay^k * mean CE_k`` over the loss-masked valid slots of each step, with metrics.

    With a draft vocabulary (``vmap`` of an EAGLE-3 drafter or an Osprey drafter converted with
    ``--draft-vocab``), slots whose target top-1 lies
    outside it are not scored unless ``score_out_of_vocab``: no draft can ever be accepted there
    (SpecForge masks them the same way). The top-1 is the store's top-k entry 0, the target's
    argmax under its full softmax, for every ``target_dist``.

    Metrics: ``loss_k{k}`` / ``acc_k{k}`` (top-1 agreement with the target) per TTT step,
    ``scored_k{k}`` (slots scored at step k), ``out_of_vocab_k{k}`` (loss-masked slots left out
    because their target top-1 is not in the draft vocabulary), ``tokens``.
    """
    B, T = batch.input_ids_BT.shape
    vmap = vmap or VocabMap()
    in_vocab_BT = None
    if vmap.target_to_draft_Vt is not None and not score_out_of_vocab:
        if batch.topk_ids_BTK is None:
            raise ConfigError("ttt_loss: leaving out-of-vocabulary targets unscored needs the store's top-k ids")
        in_vocab_BT = vmap.to_draft(batch.topk_ids_BTK[..., 0]) >= 0
    cond0_BTD = drafter.fuse_taps(batch.taps_BTLDt)
    base_idx_BT = torch.arange(B * T, device=batch.input_ids_BT.device).reshape(B, T)
    # Connected to the graph even if no slot is scored (a batch of prompt-only samples), so
    # backward still runs and simply yields zero gradients.
    total = (cond0_BTD.sum() * 0.0).float()
    metrics: dict[str, float] = {"tokens": float(B * T)}

    def score(k: int, h_BTD: Tensor) -> None:
        nonlocal total
        mask_BT = shift_left(batch.loss_mask_BT.bool(), k, False) & step_valid(batch.doc_ids_BT, k)
        if in_vocab_BT is not None:
            reachable_BT = mask_BT & shift_left(in_vocab_BT, k, False)
            metrics[f"out_of_vocab_k{k}"] = float((mask_BT & ~reachable_BT).sum())
            mask_BT = reachable_BT
        n = int(mask_BT.sum())
        metrics[f"scored_k{k}"] = float(n)
        if n == 0:
            return
        rows = _target_rows(batch, (base_idx_BT + k)[mask_BT])
        normed_ND = drafter.head_input(h_BTD[mask_BT])
        ce_sum, correct = chunked_distill_ce(normed_ND, drafter.lm_head, rows, mode=target_dist,
                                             vmap=vmap, target_head=target_head, chunk_size=chunk_size)
        total = total + (decay ** k) * ce_sum / n
        metrics[f"loss_k{k}"] = float(ce_sum.detach()) / n
        metrics[f"acc_k{k}"] = float(correct) / n

    ttt_hidden_states(drafter, batch.input_ids_BT, cond0_BTD, batch.position_ids_BT, batch.doc_ids_BT,
                      steps, impl=impl, checkpoint_steps=checkpoint_steps, on_step=score)
    return TTTOutput(loss=total, metrics=metrics)

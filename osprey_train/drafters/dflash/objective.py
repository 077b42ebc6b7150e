"""DFlash training on a feature store that exists today: random block anchors, hard labels, decayed weights.

The packed row is the engine layout of :mod:`osprey_train.ttt.layout` (slot ``p``: token
``x_{p+1}``, taps ``c_p``, position ``p``), so everything a block needs is already in it:

- anchor slot ``p``: the block's first token is ``x_{p+1}`` at position ``p + 1``; its context is
  the taps of slots ``doc_start .. p`` (positions ``0 .. p``: strictly before the anchor, in its own
  document), as a live round after committing ``x_0 .. x_{p+1}`` sees it;
- mask slot ``j`` (``1 .. B - 1``) predicts ``x_{p+1+j}`` = the input token of slot ``p + j``,
  scored when it lies in the same document and in the response (``loss_mask`` of slot ``p + j - 1``);
- eligible anchors: the anchor token and the first label are both response tokens (the first
  live round anchors at the prefill's token, the first response token); ``anchor_fraction`` of
  them are drawn without replacement at every step, from torch's global generator, which the
  trainer's checkpoints save and restore, so a resumed run draws the same anchors;
- loss: ``sum_j w_j CE_j / sum_j w_j`` over the scored labels, ``w_j = decay^(j-1)``, ``decay`` =
  ``--ttt-decay`` (0.8 by default, about the DFlash recipe's ``exp(-1/gamma)`` with gamma = 4 at
  block 8). ``--ttt-steps`` does not apply: every mask slot of the block is trained;
- ``CE_j``, by the drafter's ``objective`` arch option: ``hard`` (default), against the stored
  response token (the target's own greedy token in a regenerated store), the objective of the
  public DFlash trainers; ``topk``, against the target's distribution stored with that token (the
  top-k log-probs of slot ``p + j - 1``, the row the chain drafters learn the same token from), with
  the chain drafters' ``--target-dist`` (``tail``: the top-k plus one bucket for the rest of the
  mass; ``renorm``: the top-k renormalised). The accuracy metrics count the stored token either way.

Blocks go through the layers ``BLOCK_ROWS`` slots at a time and the LM head ``loss_chunk`` rows at
a time, each under activation checkpointing, so neither the attention scores of all blocks nor
their ``[rows, V]`` logits are ever held at once.

Legend: N blocks, B block slots, P slots of the row, R scored rows, C chunk rows, D hidden, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from osprey_data.errors import ConfigError
from osprey_train.drafters.dflash.arch import anchor_fraction_of, objective_of
from osprey_train.ttt.loss import TARGET_DISTS, TargetRows, VocabMap

__all__ = ["DFlashObjective", "row_blocks", "RowBlocks", "BLOCK_ROWS"]

BLOCK_ROWS = 512
"""Block slots (blocks x block size) forwarded per checkpointed group in training."""


class RowBlocks:
    """The blocks of one packed row: anchor slots, their context mask, labels and label weights."""

    def __init__(self, anchors_N: torch.Tensor, allowed_NP: torch.Tensor, labels_NJ: torch.Tensor,
                 scored_NJ: torch.Tensor, target_slots_NJ: torch.Tensor) -> None:
        self.anchors_N, self.allowed_NP, self.labels_NJ, self.scored_NJ = anchors_N, allowed_NP, labels_NJ, scored_NJ
        self.target_slots_NJ = target_slots_NJ
        """The slot whose stored top-k is each label's distribution: the one before the label's slot."""


def eligible_anchors(doc_P: torch.Tensor, loss_mask_P: torch.Tensor) -> torch.Tensor:
    """Slots whose anchor token (``x_{p+1}``, mask of slot ``p - 1``) and first label (slot ``p``) are response tokens."""
    same_doc = torch.zeros_like(loss_mask_P)
    same_doc[1:] = (doc_P[1:] == doc_P[:-1]) & loss_mask_P[:-1]
    return torch.nonzero(loss_mask_P & same_doc).flatten()


def row_blocks(anchors_N: torch.Tensor, ids_P: torch.Tensor, doc_P: torch.Tensor, loss_mask_P: torch.Tensor,
               block_size: int) -> RowBlocks:
    """Context masks and labels of the blocks anchored at slots ``anchors_N`` of one row."""
    slots = ids_P.shape[0]
    index_P = torch.arange(slots, device=ids_P.device)
    allowed_NP = (doc_P[None] == doc_P[anchors_N, None]) & (index_P[None] <= anchors_N[:, None])
    offsets_J = torch.arange(1, block_size, device=ids_P.device)
    label_slot_NJ = anchors_N[:, None] + offsets_J[None]                 # slot whose input token is the label
    inside_NJ = label_slot_NJ < slots
    clamped = label_slot_NJ.clamp(max=slots - 1)
    scored_NJ = inside_NJ & (doc_P[clamped] == doc_P[anchors_N, None]) & loss_mask_P[clamped - 1]
    return RowBlocks(anchors_N, allowed_NP, ids_P[clamped], scored_NJ, clamped - 1)


def _chunk_ce(hidden_CD: torch.Tensor, labels_C: torch.Tensor, norm: nn.Module, head: nn.Linear
              ) -> tuple[torch.Tensor, torch.Tensor]:
    logits_CV = head(norm(hidden_CD)).float()
    return F.cross_entropy(logits_CV, labels_C, reduction="none"), logits_CV.argmax(-1)


def _chunk_topk_ce(hidden_CD: torch.Tensor, topk_ids_CK: torch.Tensor, topk_logprobs_CK: torch.Tensor,
                   norm: nn.Module, head: nn.Linear, target_dist: str) -> tuple[torch.Tensor, torch.Tensor]:
    logits_CV = head(norm(hidden_CD)).float()
    rows = TargetRows(topk_ids_NK=topk_ids_CK, topk_logprobs_NK=topk_logprobs_CK)
    ce_C, _ = TARGET_DISTS[target_dist](logits_CV, rows, VocabMap(), None)   # the target's vocabulary
    return ce_C, logits_CV.argmax(-1)


class DFlashObjective(nn.Module):
    """The drafter plus its block-training forward: ``forward(batch) -> (loss, metrics)``."""

    def __init__(self, drafter: nn.Module, *, decay: float, chunk_size: int, target_dist: str | None = None) -> None:
        super().__init__()
        if not 0 < decay <= 1:
            raise ConfigError(f"distill --arch dflash: --ttt-decay is the per-block-position weight decay, in (0, 1]; "
                              f"got {decay}")
        self.objective = objective_of(drafter.config)
        if self.objective == "topk" and target_dist not in ("tail", "renorm"):
            raise ConfigError(f"distill --arch dflash with objective topk learns the stored top-k: --target-dist "
                              f"must be tail or renorm, got {target_dist!r}")
        self.drafter = drafter
        self.decay, self.chunk_size, self.target_dist = decay, chunk_size, target_dist
        self.blocks_per_group = max(1, BLOCK_ROWS // drafter.block_size)
        self.checkpoint_steps = False   # the layers are shallow; the LM head chunks are always checkpointed

    @classmethod
    def from_config(cls, drafter: nn.Module, cfg, target_head) -> "DFlashObjective":
        """The ``objective`` hook: the stored response tokens, or their stored top-k, are the labels
        (the target head is not needed)."""
        if cfg.target_dist == "full":
            raise ConfigError("distill --arch dflash learns the stored response tokens or their stored top-k; "
                              "--target-dist full does not apply")
        return cls(drafter, decay=cfg.ttt_decay, chunk_size=cfg.loss_chunk, target_dist=cfg.target_dist)

    def _group_hidden(self, anchor_ids_G: torch.Tensor, anchor_pos_G: torch.Tensor, allowed_GP: torch.Tensor,
                      *flat_context: torch.Tensor) -> torch.Tensor:
        context = list(zip(flat_context[0::2], flat_context[1::2]))
        return self.drafter.block_hidden(anchor_ids_G, anchor_pos_G, self.drafter.block_size, context, allowed_GP)

    def draw_anchors(self, eligible_M: torch.Tensor) -> torch.Tensor:
        """``anchor_fraction`` of the eligible slots, drawn without replacement, sorted."""
        count = max(1, math.ceil(eligible_M.numel() * anchor_fraction_of(self.drafter.config)))
        pick = torch.randperm(eligible_M.numel())[:count].to(eligible_M.device)
        return eligible_M[pick].sort().values

    def forward(self, batch) -> tuple[torch.Tensor, dict[str, float]]:
        drafter = self.drafter
        block = drafter.block_size
        weights_J = self.decay ** torch.arange(block - 1, dtype=torch.float32, device=batch.input_ids_BT.device)
        total = batch.input_ids_BT.new_zeros((), dtype=torch.float32)
        weight_sum = 0.0
        correct_J = torch.zeros(block - 1)
        scored_J = torch.zeros(block - 1)
        anchors = 0
        for row in range(batch.input_ids_BT.shape[0]):
            ids_P, doc_P = batch.input_ids_BT[row], batch.doc_ids_BT[row]
            mask_P = batch.loss_mask_BT[row].bool()
            eligible = eligible_anchors(doc_P, mask_P)
            if eligible.numel() == 0:
                continue
            blocks = row_blocks(self.draw_anchors(eligible), ids_P, doc_P, mask_P, block)
            context = drafter.context(batch.taps_BTLDt[row], batch.position_ids_BT[row])
            flat_context = [t for kv in context for t in kv]
            anchor_ids_N = ids_P[blocks.anchors_N]
            anchor_pos_N = batch.position_ids_BT[row][blocks.anchors_N] + 1
            # blocks a group at a time, each group recomputed in backward: the (blocks, heads, slots, context)
            # scores of one group are alive at once, whatever the row's length and anchor count
            for first in range(0, anchor_ids_N.shape[0], self.blocks_per_group):
                group = slice(first, first + self.blocks_per_group)
                scored_GJ = blocks.scored_NJ[group]
                if not bool(scored_GJ.any()):
                    continue
                hidden_GBD = checkpoint(self._group_hidden, anchor_ids_N[group], anchor_pos_N[group],
                                        blocks.allowed_NP[group], *flat_context, use_reentrant=False)
                rows_RD = hidden_GBD[:, 1:][scored_GJ]
                labels_R = blocks.labels_NJ[group][scored_GJ]
                slot_R = torch.nonzero(scored_GJ)[:, 1]
                if self.objective == "topk":
                    source_R = blocks.target_slots_NJ[group][scored_GJ]
                    topk_ids_RK = batch.topk_ids_BTK[row][source_R]
                    topk_logprobs_RK = batch.topk_logprobs_BTK[row][source_R]
                for start in range(0, rows_RD.shape[0], self.chunk_size):
                    part = slice(start, start + self.chunk_size)
                    if self.objective == "topk":
                        ce_C, argmax_C = checkpoint(_chunk_topk_ce, rows_RD[part], topk_ids_RK[part],
                                                    topk_logprobs_RK[part], drafter.norm, drafter.lm_head,
                                                    self.target_dist, use_reentrant=False)
                    else:
                        ce_C, argmax_C = checkpoint(_chunk_ce, rows_RD[part], labels_R[part], drafter.norm,
                                                    drafter.lm_head, use_reentrant=False)
                    total = total + (ce_C * weights_J[slot_R[part]]).sum()
                    correct_J += torch.bincount(slot_R[part][argmax_C == labels_R[part]].cpu(),
                                                minlength=block - 1).float()
                weight_sum += float(weights_J[slot_R].sum())
                scored_J += torch.bincount(slot_R.cpu(), minlength=block - 1).float()
            anchors += int(blocks.anchors_N.numel())
        if weight_sum == 0:
            # no response position in this batch: a zero loss that still reaches every trainable weight
            zero = sum(p.sum() for p in drafter.parameters() if p.requires_grad) * 0.0
            return zero, {"loss": 0.0, "anchors": 0.0, "tokens": float(batch.input_ids_BT.numel())}
        loss = total / weight_sum
        # "tokens": the packed batch's slots, as the chain objective counts them (the trainer's tokens/s)
        metrics = {"loss": float(loss.detach()), "anchors": float(anchors),
                   "tokens": float(batch.input_ids_BT.numel())}
        for j in range(block - 1):
            if scored_J[j] > 0:
                metrics[f"acc_k{j + 1}"] = float(correct_J[j] / scored_J[j])
                metrics[f"scored_k{j + 1}"] = float(scored_J[j])
        return loss, metrics

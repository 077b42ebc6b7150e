"""Chunked LM head + distillation cross-entropy against the target's distribution.

The drafter's logits are never held for all tokens (let alone all TTT steps) at once: rows are
processed ``chunk_size`` at a time, each chunk under activation checkpointing, so forward and
backward keep at most one ``[chunk, V]`` fp32 block alive (plus its gradient).

Target distributions (registry ``TARGET_DISTS``):

* ``tail`` (default) — the store's top-k log-probs (under the target's FULL softmax) plus one extra
  bucket holding the tail mass ``1 - sum(exp(topk))``; the drafter's tail is the mass it puts
  outside those k tokens. This is the exact cross-entropy of the two distributions coarse-grained
  to ``k + 1`` outcomes: its minimizer matches the target's probabilities on the top-k tokens
  exactly and it keeps the target's uncertainty (a flat target is not turned into a peaked one).
* ``renorm`` — softmax over the top-k log-probs only (drops the tail); sharper targets, biased
  towards over-confidence when the target is uncertain.
* ``full`` — exact full-vocabulary targets: the store's ``final_hidden`` (after the target's
  final norm) through the target's LM head (:mod:`osprey_train.ttt.target_head`).

EAGLE-3 drafters predict over a reduced draft vocabulary (``draft_to_target`` maps draft id ->
target id). The target distribution is restricted to it: top-k tokens outside the draft vocab
fall into the tail bucket (``tail``) or are dropped (``renorm``); ``full`` restricts the target
logits to the draft vocab and renormalizes (as EAGLE-3 does). Accuracy always compares *target*
ids (draft argmax mapped through ``draft_to_target`` vs the target's top-1).

Legend: N rows (masked token slots), C chunk rows, D drafter hidden, Dt target hidden,
K top-k, V draft vocab, Vt target vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from osprey_data.errors import ConfigError

__all__ = ["TARGET_DISTS", "DEFAULT_TARGET_DIST", "TargetRows", "VocabMap", "chunked_distill_ce",
           "target_to_draft_map"]

DEFAULT_TARGET_DIST = "tail"
_TAIL_EPS = 1e-6


@dataclass
class TargetRows:
    """The target side of N rows: top-k (ids in TARGET vocab, log-probs) or final hidden."""

    topk_ids_NK: Tensor | None = None
    topk_logprobs_NK: Tensor | None = None
    final_hidden_NDt: Tensor | None = None

    def take(self, idx: Tensor | slice) -> "TargetRows":
        pick = lambda x: None if x is None else x[idx]  # noqa: E731
        return TargetRows(topk_ids_NK=pick(self.topk_ids_NK),
                          topk_logprobs_NK=pick(self.topk_logprobs_NK),
                          final_hidden_NDt=pick(self.final_hidden_NDt))


@dataclass
class VocabMap:
    """Draft <-> target vocabulary maps; both None for Osprey (draft vocab == target vocab)."""

    draft_to_target_V: Tensor | None = None   # (V,) draft id -> target id
    target_to_draft_Vt: Tensor | None = None  # (Vt,) target id -> draft id or -1

    @classmethod
    def from_drafter(cls, draft_to_target: Tensor | None, target_vocab_size: int) -> "VocabMap":
        if draft_to_target is None:
            return cls()
        return cls(draft_to_target.long(), target_to_draft_map(draft_to_target, target_vocab_size))

    def to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids if self.draft_to_target_V is None else self.draft_to_target_V[draft_ids]

    def to_draft(self, target_ids: Tensor) -> Tensor:
        if self.target_to_draft_Vt is None:
            return target_ids.long()
        return self.target_to_draft_Vt[target_ids.long()]

    def to_target_probs(self, probs_V: Tensor, target_vocab_size: int) -> Tensor:
        """A distribution over draft ids scattered into the target vocabulary (zeros elsewhere)."""
        if self.draft_to_target_V is None:
            return probs_V
        full_Vt = probs_V.new_zeros(target_vocab_size)
        full_Vt[self.draft_to_target_V] = probs_V
        return full_Vt


def target_to_draft_map(draft_to_target_V: Tensor, target_vocab_size: int) -> Tensor:
    """Inverse of ``draft_to_target``: (Vt,) with the draft id of each target id, -1 if absent."""
    t2d = torch.full((target_vocab_size,), -1, dtype=torch.long, device=draft_to_target_V.device)
    t2d[draft_to_target_V.long()] = torch.arange(draft_to_target_V.numel(), device=t2d.device)
    return t2d


# --- per-chunk cross-entropies: (logits_CV fp32, rows, vocab map, target head) -> (ce_C, top1_C)


def _topk_parts(logits_CV: Tensor, rows: TargetRows, vmap: VocabMap):
    ids_CK = vmap.to_draft(rows.topk_ids_NK)
    valid_CK = ids_CK >= 0
    safe_CK = ids_CK.clamp_min(0)
    logq_CV = logits_CV - torch.logsumexp(logits_CV, dim=-1, keepdim=True)
    logq_CK = logq_CV.gather(1, safe_CK)
    return ids_CK, valid_CK, safe_CK, logq_CV, logq_CK


def _ce_tail(logits_CV, rows, vmap, head):
    ids_CK, valid_CK, safe_CK, logq_CV, logq_CK = _topk_parts(logits_CV, rows, vmap)
    p_CK = torch.where(valid_CK, rows.topk_logprobs_NK.float().exp(), torch.zeros_like(logq_CK))
    p_tail_C = (1.0 - p_CK.sum(-1)).clamp_min(0.0)
    # Drafter's tail: its mass outside the (mapped) top-k tokens.
    # (scatter_add of the valid flags, so an invalid entry clamped to id 0 cannot collide.)
    hit_CV = torch.zeros_like(logq_CV).scatter_add(1, safe_CK, valid_CK.to(logq_CV.dtype))
    # finfo.min rather than -inf keeps backward finite when the top-k covers the whole vocab.
    outside_CV = logq_CV.masked_fill(hit_CV > 0, torch.finfo(logq_CV.dtype).min)
    logq_tail_C = torch.logsumexp(outside_CV, dim=-1)
    # A tail below fp32 rounding of 1 - sum(p) is treated as empty.
    has_tail_C = (p_tail_C > _TAIL_EPS) & (hit_CV > 0).logical_not().any(-1)
    tail_term_C = torch.where(has_tail_C, p_tail_C * logq_tail_C, torch.zeros_like(p_tail_C))
    ce_C = -(p_CK * torch.where(valid_CK, logq_CK, torch.zeros_like(logq_CK))).sum(-1) - tail_term_C
    return ce_C, rows.topk_ids_NK[:, 0].long()


def _ce_renorm(logits_CV, rows, vmap, head):
    ids_CK, valid_CK, safe_CK, logq_CV, logq_CK = _topk_parts(logits_CV, rows, vmap)
    lp_CK = rows.topk_logprobs_NK.float().masked_fill(~valid_CK, float("-inf"))
    any_C = valid_CK.any(-1)
    p_CK = torch.softmax(torch.where(any_C[:, None], lp_CK, torch.zeros_like(lp_CK)), dim=-1)
    p_CK = torch.where(valid_CK, p_CK, torch.zeros_like(p_CK))
    ce_C = -(p_CK * torch.where(valid_CK, logq_CK, torch.zeros_like(logq_CK))).sum(-1)
    return ce_C, rows.topk_ids_NK[:, 0].long()


def _ce_full(logits_CV, rows, vmap, head):
    if head is None or rows.final_hidden_NDt is None:
        raise ConfigError("target distribution 'full' needs the store's final_hidden and the "
                          "target's LM head")
    t_logits_CVt = head(rows.final_hidden_NDt).float()
    top1_C = t_logits_CVt.argmax(-1)
    if vmap.draft_to_target_V is not None:
        t_logits_CVt = t_logits_CVt[:, vmap.draft_to_target_V]
    p_CV = torch.softmax(t_logits_CVt, dim=-1)
    ce_C = -(p_CV * torch.log_softmax(logits_CV, dim=-1)).sum(-1)
    return ce_C, top1_C


TARGET_DISTS: dict[str, Callable] = {"tail": _ce_tail, "renorm": _ce_renorm, "full": _ce_full}


def _chunk_loss(normed_CD, weight_VD, bias_V, mode, vmap, head, *row_tensors):
    rows = TargetRows(*row_tensors)
    logits_CV = F.linear(normed_CD, weight_VD, bias_V).float()
    ce_C, target_top1_C = TARGET_DISTS[mode](logits_CV, rows, vmap, head)
    pred_C = vmap.to_target(logits_CV.detach().argmax(-1))
    correct = (pred_C == target_top1_C).sum().to(logits_CV.dtype)
    return ce_C.sum(), correct


def chunked_distill_ce(normed_ND: Tensor, lm_head: torch.nn.Linear, rows: TargetRows, *,
                       mode: str = DEFAULT_TARGET_DIST, vmap: VocabMap | None = None,
                       target_head: Callable[[Tensor], Tensor] | None = None,
                       chunk_size: int = 1024) -> tuple[Tensor, Tensor]:
    """Sum over N rows of CE(target, drafter) and the number of top-1 agreements.

    ``normed_ND`` is the drafter's final-normed hidden of the rows to score (already selected by
    the loss mask). Each chunk of rows runs under checkpointing, so its ``[C, V]`` logits exist
    only while that chunk is computed (forward) or recomputed (backward).
    """
    if mode not in TARGET_DISTS:
        raise ConfigError(f"unknown target distribution {mode!r}; choose from {sorted(TARGET_DISTS)}")
    vmap = vmap or VocabMap()
    total = normed_ND.new_zeros((), dtype=torch.float32)
    correct = torch.zeros((), dtype=torch.float32, device=normed_ND.device)
    n = normed_ND.shape[0]
    for lo in range(0, n, chunk_size):
        part = rows.take(slice(lo, lo + chunk_size))
        args = (normed_ND[lo:lo + chunk_size], lm_head.weight, lm_head.bias, mode, vmap, target_head,
                part.topk_ids_NK, part.topk_logprobs_NK, part.final_hidden_NDt)
        if torch.is_grad_enabled() and normed_ND.requires_grad:
            ce, corr = checkpoint(_chunk_loss, *args, use_reentrant=False)
        else:
            ce, corr = _chunk_loss(*args)
        total = total + ce
        correct = correct + corr.detach()
    return total, correct

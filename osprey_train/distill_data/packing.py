"""Packing store samples into fixed token budgets for TTT distillation.

Each micro-batch is ONE row of whole samples laid end to end in the engine layout
(:mod:`osprey_train.ttt.layout`: slot ``p`` of a sample holds token ``x_{p+1}``, the target taps
``c_p`` and position ``p``, so a sample of ``n`` tokens fills ``n - 1`` slots). Document ids keep
samples apart in attention, positions restart at 0 per sample, and rows are filled greedily up
to ``tokens_per_batch`` slots: no padding at all. The order is a seeded permutation per epoch,
so ``batch(index)`` is a pure function of ``(seed, index)``, which makes resume exact and lets
every rank take its own micro-batches (``index = (step * grad_accum + micro) * world + rank``).

A sample with more slots than the budget is truncated to it (counted in ``PackPlan.truncated``);
samples with fewer than 3 tokens have no slot to score and are skipped.

Row contents per slot ``p``: ``input_ids = x_{p+1}``, ``taps = c_p``, target top-k / final hidden
of store position ``p + 1`` (what predicts ``x_{p+2}``), ``loss_mask = store.loss_mask[p + 2]``.

Legend: T tokens, P slots, L taps, Dt target hidden, K top-k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from osprey_data.errors import ConfigError, StoreError
from osprey_train.ttt.layout import MIN_DOCUMENT_TOKENS, num_slots, slot_inputs, slot_loss_mask, slot_targets
from osprey_train.ttt.unroll import PackedBatch

__all__ = ["PackPlan", "plan_epoch", "StorePacker", "pack_samples", "keep_topk"]


@dataclass
class PackPlan:
    """Sample indices of every packed row of one epoch."""

    rows: list[list[int]]
    truncated: int = 0
    skipped: int = 0


def plan_epoch(lengths: np.ndarray, tokens_per_batch: int, seed: int, epoch: int) -> PackPlan:
    """Greedy in-order packing of a seeded permutation of the samples (``lengths`` in tokens)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(lengths))
    rows: list[list[int]] = []
    cur: list[int] = []
    used = 0
    plan = PackPlan(rows=rows)
    for i in order.tolist():
        if int(lengths[i]) < MIN_DOCUMENT_TOKENS:
            plan.skipped += 1
            continue
        n = num_slots(int(lengths[i]))
        if n > tokens_per_batch:
            plan.truncated += 1
            n = tokens_per_batch
        if cur and used + n > tokens_per_batch:
            rows.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        rows.append(cur)
    return plan


def keep_topk(ids_TK: torch.Tensor, logprobs_TK: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely of each row's stored top-K (all K when ``k`` is 0 or >= K), most likely
    first; selected by log-prob, so the store's own column order does not matter."""
    if not k or k >= logprobs_TK.shape[-1]:
        return ids_TK, logprobs_TK
    top_TK = logprobs_TK.topk(k, dim=-1, sorted=True)
    return ids_TK.gather(-1, top_TK.indices), top_TK.values


def pack_samples(samples: list, tokens_per_batch: int, *, need_final_hidden: bool = False,
                 teacher_topk: int = 0) -> PackedBatch:
    """Lay ``samples`` (store ``Sample``s, ``as_torch=True``) end to end into one row of slots; with
    ``teacher_topk``, only that many of each position's stored top-k (:func:`keep_topk`)."""
    ids, docs, pos, taps, mask, tids, tlps, finals = [], [], [], [], [], [], [], []
    for d, s in enumerate(samples):
        n = min(int(s.token_ids.shape[0]), tokens_per_batch + 1)  # at most tokens_per_batch slots
        if n < MIN_DOCUMENT_TOKENS:
            continue
        p = num_slots(n)
        ids_P, taps_PLDt = slot_inputs(torch.as_tensor(s.token_ids[:n]).long(), torch.as_tensor(s.hidden_TLD[:n]))
        ids.append(ids_P)
        docs.append(torch.full((p,), d, dtype=torch.long))
        pos.append(torch.arange(p))
        taps.append(taps_PLDt)
        mask.append(slot_loss_mask(s.loss_mask[:n]))
        ids_TK, lps_TK = keep_topk(torch.as_tensor(s.topk_ids_TK[:n]).long(),
                                   torch.as_tensor(s.topk_logprobs_TK[:n]).float(), teacher_topk)
        tids.append(slot_targets(ids_TK))
        tlps.append(slot_targets(lps_TK))
        if need_final_hidden:
            if s.final_hidden_TD is None:
                raise StoreError(f"sample {s.sample_id!r} has no final_hidden; the store was built "
                                 "without it (use --target-dist tail or renorm)")
            finals.append(slot_targets(torch.as_tensor(s.final_hidden_TD[:n])))
    if not ids:
        raise StoreError(f"pack_samples: none of the {len(samples)} samples has >= {MIN_DOCUMENT_TOKENS} tokens")
    cat = lambda xs: torch.cat(xs)[None]  # noqa: E731
    return PackedBatch(input_ids_BT=cat(ids), doc_ids_BT=cat(docs), position_ids_BT=cat(pos),
                       taps_BTLDt=cat(taps), loss_mask_BT=cat(mask), topk_ids_BTK=cat(tids),
                       topk_logprobs_BTK=cat(tlps),
                       final_hidden_BTDt=cat(finals) if need_final_hidden else None)


@dataclass
class StorePacker:
    """Deterministic packed micro-batches from a ``StoreReader``."""

    reader: object
    tokens_per_batch: int
    seed: int = 0
    need_final_hidden: bool = False
    teacher_topk: int = 0
    _lengths: np.ndarray = field(init=False, repr=False)
    _plans: dict[int, PackPlan] = field(init=False, default_factory=dict, repr=False)
    _counts: list[int] = field(init=False, default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.tokens_per_batch < 2:
            raise ConfigError(f"tokens_per_batch must be >= 2, got {self.tokens_per_batch}")
        self._lengths = np.asarray(self.reader.table(["num_tokens"]).column(0).to_numpy(), dtype=np.int64)
        if len(self._lengths) == 0 or int((self._lengths >= MIN_DOCUMENT_TOKENS).sum()) == 0:
            raise StoreError(f"store {getattr(self.reader, 'url', '?')} has no sample with >= "
                             f"{MIN_DOCUMENT_TOKENS} tokens to distill on")

    def plan(self, epoch: int) -> PackPlan:
        if epoch not in self._plans:
            # Keep only the latest plan: epochs are visited in order.
            self._plans = {epoch: plan_epoch(self._lengths, self.tokens_per_batch, self.seed, epoch)}
        return self._plans[epoch]

    def locate(self, index: int) -> tuple[int, int]:
        """(epoch, row) of global micro-batch ``index``; epochs may have different row counts."""
        epoch = 0
        while True:
            if epoch >= len(self._counts):
                self._counts.append(len(plan_epoch(self._lengths, self.tokens_per_batch, self.seed,
                                                   epoch).rows))
            if index < self._counts[epoch]:
                return epoch, index
            index -= self._counts[epoch]
            epoch += 1

    def batch(self, index: int) -> PackedBatch:
        epoch, row = self.locate(index)
        samples = [self.reader.sample(i, as_torch=True) for i in self.plan(epoch).rows[row]]
        return pack_samples(samples, self.tokens_per_batch, need_final_hidden=self.need_final_hidden,
                            teacher_topk=self.teacher_topk)

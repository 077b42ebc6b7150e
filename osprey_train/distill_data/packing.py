"""Packing store samples into fixed token budgets for TTT distillation.

Each micro-batch is ONE row of whole samples laid end to end (document ids keep them apart in
attention, positions restart at 0 per sample), filled greedily up to ``tokens_per_batch``: no
padding at all, rows are as long as their samples. The order is a seeded permutation per epoch,
so ``batch(index)`` is a pure function of ``(seed, index)``, which makes resume exact and lets
every rank take its own micro-batches (``index = (step * grad_accum + micro) * world + rank``).

A sample longer than the budget is truncated to it (counted in ``PackPlan.truncated``); samples
with fewer than 2 tokens predict nothing and are skipped.

Loss mask: the store marks *tokens* (assistant content + end of turn); the prediction made at
position ``t`` is of token ``t + 1``, so the packed row's ``loss_mask[t] = store.loss_mask[t+1]``
(0 at each sample's last position).

Legend: T tokens, L taps, Dt target hidden, K top-k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from osprey_data.errors import ConfigError, StoreError
from osprey_train.ttt.unroll import PackedBatch

__all__ = ["PackPlan", "plan_epoch", "StorePacker", "pack_samples"]


@dataclass
class PackPlan:
    """Sample indices of every packed row of one epoch."""

    rows: list[list[int]]
    truncated: int = 0
    skipped: int = 0


def plan_epoch(lengths: np.ndarray, tokens_per_batch: int, seed: int, epoch: int) -> PackPlan:
    """Greedy in-order packing of a seeded permutation of the samples."""
    order = np.random.default_rng([seed, epoch]).permutation(len(lengths))
    rows: list[list[int]] = []
    cur: list[int] = []
    used = 0
    plan = PackPlan(rows=rows)
    for i in order.tolist():
        n = int(lengths[i])
        if n < 2:
            plan.skipped += 1
            continue
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


def pack_samples(samples: list, tokens_per_batch: int, *, need_final_hidden: bool = False) -> PackedBatch:
    """Lay ``samples`` (store ``Sample``s, ``as_torch=True``) end to end into one row."""
    ids, docs, pos, taps, mask, tids, tlps, finals = [], [], [], [], [], [], [], []
    for d, s in enumerate(samples):
        n = min(int(s.token_ids.shape[0]), tokens_per_batch)
        tok = torch.as_tensor(s.token_ids[:n]).long()
        lm = torch.as_tensor(s.loss_mask[:n]).bool()
        pred_mask = torch.zeros(n, dtype=torch.bool)
        pred_mask[:-1] = lm[1:]
        ids.append(tok)
        docs.append(torch.full((n,), d, dtype=torch.long))
        pos.append(torch.arange(n))
        taps.append(torch.as_tensor(s.hidden_TLD[:n]))
        mask.append(pred_mask)
        tids.append(torch.as_tensor(s.topk_ids_TK[:n]).long())
        tlps.append(torch.as_tensor(s.topk_logprobs_TK[:n]).float())
        if need_final_hidden:
            if s.final_hidden_TD is None:
                raise StoreError(f"sample {s.sample_id!r} has no final_hidden; the store was built "
                                 "without it (use --target-dist tail or renorm)")
            finals.append(torch.as_tensor(s.final_hidden_TD[:n]))
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
    _lengths: np.ndarray = field(init=False, repr=False)
    _plans: dict[int, PackPlan] = field(init=False, default_factory=dict, repr=False)
    _counts: list[int] = field(init=False, default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.tokens_per_batch < 2:
            raise ConfigError(f"tokens_per_batch must be >= 2, got {self.tokens_per_batch}")
        self._lengths = np.asarray(self.reader.table(["num_tokens"]).column(0).to_numpy(), dtype=np.int64)
        if len(self._lengths) == 0 or int((self._lengths >= 2).sum()) == 0:
            raise StoreError(f"store {getattr(self.reader, 'url', '?')} has no sample with >= 2 tokens "
                             "to distill on")

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
        return pack_samples(samples, self.tokens_per_batch, need_final_hidden=self.need_final_hidden)

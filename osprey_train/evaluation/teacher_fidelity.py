"""How much of the target's next-token distribution a stored top-k keeps (issue 33).

A store keeps the target's top-k log-probs (under the full softmax) at every position. For each
k, and each position's full distribution ``p`` over the vocabulary:

- ``mass``: the probability the top-k covers, ``m_k = sum of the k largest p_i``;
- ``kl_renorm``: KL(q || p) of the renormalised top-k ``q = p / m_k`` on the top-k (0 elsewhere)
  from the full distribution; it is exactly ``-log m_k`` (KL(p || q) is infinite: q is 0 off the
  top-k, which is why the trainer's ``--target-dist tail`` keeps the rest as one bucket);
- ``tail_entropy``: the entropy (nats) of the distribution inside the tail, ``p`` restricted to
  the other tokens and renormalised: what the tail bucket lumps together (0 when the tail is one
  token or empty).

Legend: N positions, V vocabulary, K the largest k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["TopkFidelity", "topk_fidelity", "POSITION_BUCKETS"]

POSITION_BUCKETS = ((0, 16), (16, 32), (32, 64), (64, 128), (128, None))
"""Response positions (0 = the first response token) grouped for the per-position figures."""


@torch.no_grad()
def topk_fidelity(logits_NV: torch.Tensor, ks: tuple[int, ...]) -> dict[int, dict[str, torch.Tensor]]:
    """Per k: ``mass_N``, ``kl_renorm_N`` and ``tail_entropy_N`` of the positions' full distributions."""
    logp_NV = torch.log_softmax(logits_NV.float(), dim=-1)
    kmax = min(max(ks), logp_NV.shape[-1])
    top_NK = logp_NV.topk(kmax, dim=-1).values
    p_NV = logp_NV.exp()
    entropy_N = -(p_NV * logp_NV).sum(-1)   # of the full distribution
    out = {}
    for k in ks:
        k_eff = min(k, logp_NV.shape[-1])
        top_logp_Nk = top_NK[:, :k_eff]
        mass_N = top_logp_Nk.exp().sum(-1).clamp(max=1.0)
        tail_N = (1.0 - mass_N).clamp(min=0.0)
        # entropy inside the tail: H(p) = sum_top -p log p + sum_tail -p log p, and the tail part
        # renormalised is (sum_tail -p log p) / r + log r
        top_part_N = -(top_logp_Nk.exp() * top_logp_Nk).sum(-1)
        tail_sum_N = (entropy_N - top_part_N).clamp(min=0.0)
        safe_N = tail_N.clamp(min=1e-30)
        tail_entropy_N = torch.where(tail_N > 1e-12, tail_sum_N / safe_N + torch.log(safe_N),
                                     torch.zeros_like(tail_N)).clamp(min=0.0)
        out[k] = {"mass": mass_N, "kl_renorm": -torch.log(mass_N.clamp(min=1e-30)), "tail_entropy": tail_entropy_N}
    return out


@dataclass
class TopkFidelity:
    """Running sums of the figures by group (a domain, a position bucket, or all)."""

    ks: tuple[int, ...]
    sums: dict[tuple[str, int, str], float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    below: dict[tuple[str, int], int] = field(default_factory=dict)
    """Positions whose mass is under ``LOW_MASS`` (a thin top-k there)."""

    LOW_MASS = 0.9

    def add(self, groups: list[str], figures: dict[int, dict[str, torch.Tensor]], select_N: torch.Tensor) -> None:
        n = int(select_N.sum())
        if n == 0:
            return
        for g in groups:
            self.counts[g] = self.counts.get(g, 0) + n
            for k, f in figures.items():
                for name, v in f.items():
                    self.sums[g, k, name] = self.sums.get((g, k, name), 0.0) + float(v[select_N].double().sum())
                self.below[g, k] = self.below.get((g, k), 0) + int((f["mass"][select_N] < self.LOW_MASS).sum())

    def table(self, group: str) -> dict[int, dict[str, float]]:
        """Per k: mean mass, mean KL of the renormalised top-k, mean tail entropy, share of thin positions."""
        n = self.counts.get(group, 0)
        return {k: {"mass": self.sums[group, k, "mass"] / n, "kl_renorm": self.sums[group, k, "kl_renorm"] / n,
                    "tail_entropy": self.sums[group, k, "tail_entropy"] / n,
                    "low_mass_share": self.below[group, k] / n, "positions": n} for k in self.ks} if n else {}

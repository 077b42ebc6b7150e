"""The target's distribution at a serving temperature, from stored top-k log-probs, with tail bounds.

The builder stores, per position, the ``K`` largest next-token log-probabilities of the target's
full softmax at temperature 1 (``log p1``; the normalizer covers the whole vocabulary, so the
tail mass ``m = 1 - sum_k p1_k`` is known). At a serving temperature ``T`` the target samples
from ``pT(x) = p1(x)^a / Z`` with ``a = 1 / T`` and ``Z = sum_k p1_k^a + tau``, where
``tau = sum_{x in tail} p1(x)^a`` is NOT stored. What is known about the tail: its ``n = V - K``
entries are each at most ``p1_K`` (the smallest stored one) and sum to ``m``. Hence

* ``a = 1`` (T = 1): ``tau = m`` exactly;
* ``a > 1`` (T < 1, ``x^a`` convex): ``tau`` is largest with the mass packed into entries of size
  ``p1_K`` -> ``tau <= m * p1_K^(a-1)``, smallest spread evenly -> ``tau >= n * (m/n)^a``;
* ``a < 1`` (T > 1): the same two configurations with the roles swapped.

So every stored ``pT`` entry lies in ``[e_k / (E + tau_hi), e_k / (E + tau_lo)]``
(``e_k = p1_k^a``, ``E = sum e_k``), and a token outside the top-k has ``0 < pT <= tail_hi``
with ``tail_hi = min(p1_K, m)^a / (E + tau_lo)``. These intervals are what
:mod:`sampled_acceptance` propagates into its tail bound. Everything is float64.

Legend: N rows (positions), K top-k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TemperedTarget", "tempered_target"]


@dataclass
class TemperedTarget:
    """Bounds on the target's distribution at temperature T on the stored top-k of each row."""

    p_lo_NK: Tensor
    """Lower bound of ``pT`` of each stored top-k token."""
    p_hi_NK: Tensor
    """Upper bound of ``pT`` of each stored top-k token (equal to ``p_lo`` at T = 1)."""
    tail_hi_N: Tensor
    """Upper bound of ``pT`` of any single token outside the stored top-k (0 if the top-k is the vocabulary)."""


def tempered_target(topk_logprobs_NK: Tensor, temperature: float, vocab_size: int) -> TemperedTarget:
    """Bounds of the tempered target distribution from temperature-1 top-k log-probs (module docstring)."""
    if temperature <= 0:
        raise ValueError("tempered_target needs temperature > 0")
    lp_NK = topk_logprobs_NK.double()
    N, K = lp_NK.shape
    a = 1.0 / float(temperature)
    p1_NK = lp_NK.exp()
    mass_N = (1.0 - p1_NK.sum(-1)).clamp_min(0.0)  # tail mass at T = 1 (fp32 rounding can go negative)
    smallest_N = p1_NK.min(-1).values
    n = max(int(vocab_size) - K, 0)
    # Every term of Z is scaled by exp(-a * max log p1) (it cancels in each ratio): at a low T,
    # p1^a itself underflows to 0 for whole rows and the ratios would be 0 / 0.
    top_N = lp_NK.max(-1).values
    e_NK = (a * (lp_NK - top_N[:, None])).exp()
    big_E_N = e_NK.sum(-1)
    if n == 0:
        zero_N = torch.zeros_like(mass_N)
        return TemperedTarget(p_lo_NK=e_NK / big_E_N[:, None], p_hi_NK=e_NK / big_E_N[:, None], tail_hi_N=zero_N)
    log_mass_N = mass_N.log()   # -inf where the tail is empty (guarded below)
    # each tail entry is <= the smallest stored one; the tail sums to `mass`
    log_small_N = smallest_N.clamp_min(1e-300).log()
    packed_N = (log_mass_N + (a - 1.0) * log_small_N - a * top_N).exp()   # mass in entries of size p1_K
    spread_N = n * (a * (log_mass_N - math.log(n) - top_N)).exp()          # mass spread over all n entries
    if a == 1.0:
        tau_lo_N = tau_hi_N = (log_mass_N - top_N).exp()
    elif a > 1.0:
        tau_lo_N, tau_hi_N = spread_N, torch.maximum(packed_N, spread_N)
    else:
        tau_lo_N, tau_hi_N = torch.minimum(packed_N, spread_N), spread_N
    tau_lo_N = torch.where(mass_N > 0, tau_lo_N, torch.zeros_like(mass_N))
    tau_hi_N = torch.where(mass_N > 0, tau_hi_N, torch.zeros_like(mass_N))
    p_lo_NK = e_NK / (big_E_N + tau_hi_N)[:, None]
    p_hi_NK = e_NK / (big_E_N + tau_lo_N)[:, None]
    tail_hi_N = (a * (torch.minimum(smallest_N, mass_N).log() - top_N)).exp() / (big_E_N + tau_lo_N)
    return TemperedTarget(p_lo_NK=p_lo_NK, p_hi_NK=p_hi_NK, tail_hi_N=tail_hi_N)

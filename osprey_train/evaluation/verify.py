"""Verification rules of speculative decoding: greedy prefix match and rejection sampling.

Pure functions on one verify step, so they can be tested exactly against naive references.

Legend: S draft steps, V vocabulary (target ids). ``target_*_SV`` has S+1 rows: row i is the
target's next-token distribution after the committed tokens plus ``draft_ids[:i]``; the last row
gives the bonus token when every draft is accepted.

- Greedy (temperature 0): accept the longest prefix of drafts equal to the target's argmax; the
  next token is the target's argmax at the first mismatch (or the bonus). The output is then
  exactly what plain greedy decoding of the target produces.
- Sampling: draft ``d_i ~ q_i`` is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``; at
  the first rejection the token is resampled from ``norm(max(0, p_i - q_i))``; if all drafts are
  accepted a bonus token is sampled from ``p_S``. Each emitted token is then distributed exactly
  as under the target (Leviathan et al. 2023; Chen et al. 2023).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["probs_from_logits", "sample_from", "verify_greedy", "verify_sampling", "residual_distribution"]


def probs_from_logits(logits_SV: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax of ``logits / temperature`` in float32 (temperature must be > 0)."""
    if temperature <= 0:
        raise ValueError("probs_from_logits needs temperature > 0; greedy uses argmax")
    return torch.softmax(logits_SV.float() / temperature, dim=-1)


def sample_from(probs_V: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from a probability vector (on CPU, so a seeded generator replays exactly)."""
    return int(torch.multinomial(probs_V.detach().float().cpu(), 1, generator=generator).item())


def residual_distribution(p_V: torch.Tensor, q_V: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))``; falls back to ``p`` only when p == q up to rounding (then no
    rejection can happen in exact arithmetic, and ``p`` is the right distribution anyway)."""
    residual_V = torch.clamp(p_V - q_V, min=0.0)
    total = float(residual_V.sum())
    if total <= 1e-12:
        return p_V / p_V.sum()
    return residual_V / total


def verify_greedy(draft_ids: Sequence[int], target_logits_SV: torch.Tensor) -> tuple[int, int]:
    """Return ``(num_accepted, next_token)`` under greedy verification."""
    if target_logits_SV.shape[0] != len(draft_ids) + 1:
        raise ValueError(f"need {len(draft_ids) + 1} target rows for {len(draft_ids)} drafts, "
                         f"got {target_logits_SV.shape[0]}")
    target_ids = target_logits_SV.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft_ids) and int(draft_ids[accepted]) == target_ids[accepted]:
        accepted += 1
    return accepted, int(target_ids[accepted])


def verify_sampling(draft_ids: Sequence[int], draft_probs_SV: torch.Tensor,
                    target_probs_SV: torch.Tensor, generator: torch.Generator | None) -> tuple[int, int]:
    """Return ``(num_accepted, next_token)`` under the standard rejection-sampling rule.

    ``draft_probs_SV`` (S rows) are the distributions the drafts were sampled from, over the
    target vocabulary; ``target_probs_SV`` has S+1 rows.
    """
    num = len(draft_ids)
    if target_probs_SV.shape[0] != num + 1 or draft_probs_SV.shape[0] < num:
        raise ValueError(f"shape mismatch: {num} drafts, draft probs {tuple(draft_probs_SV.shape)}, "
                         f"target probs {tuple(target_probs_SV.shape)}")
    p_SV = target_probs_SV.detach().float().cpu()
    q_SV = draft_probs_SV.detach().float().cpu()
    for i, token in enumerate(draft_ids):
        p = float(p_SV[i, token])
        q = float(q_SV[i, token])
        u = float(torch.rand((), generator=generator))
        # accept with probability min(1, p/q), written without dividing by a possibly-zero q
        if u * q < p:
            continue
        return i, sample_from(residual_distribution(p_SV[i], q_SV[i]), generator)
    return num, sample_from(p_SV[num], generator)

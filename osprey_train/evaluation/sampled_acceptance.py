"""Offline acceptance of chain speculative SAMPLING at a serving temperature, from a sampled store.

Speculative sampling (:func:`~osprey_train.evaluation.verify.verify_sampling`): in a round that
starts with ``x_0 .. x_p`` committed, the drafter samples ``d_j ~ q_j`` (temperature T), the
target accepts ``d_j`` with probability ``min(1, p_j(d_j) / q_j(d_j))`` (``p_j`` = the target at
T), and at the first rejection resamples from the residual; every emitted token is distributed
exactly as under the target alone. The derivation (docs/evaluation.md, "Sampled acceptance"):

* ``P(d_1..d_k accepted and equal to y_1..y_k) = prod_{j<=k} min(p_j(y_j), q_j(y_j))`` (drafts and
  acceptances of a round, chain drafted along ``y``); the emitted tokens of the whole decode are a
  target sample path ``y ~ p`` whatever the drafter does;
* so, given the emitted path ``y``, a round starting at ``p`` accepts at least ``k`` drafts with
  probability ``prod_{j<=k} r_{p,j}``, ``r_{p,j} = min(1, q_j(y_{p+j}) / p_j(y_{p+j}))``, independently
  of later tokens. The rounds along ``y`` are a Markov chain over round starts; a stored response
  sampled from the target at T IS such a path.

Per sample, :func:`expected_rounds` runs that chain exactly (a forward pass over the round-start
probabilities): the expected number of verify rounds and, per draft position, the expected number
of rounds reaching it and accepting it. Aggregates are ratios of sums, as the greedy walk
(:mod:`acceptance`) and SGLang count them: AL = sum(tokens) / sum(E[rounds | y]). With ``r`` in
{0, 1} (greedy) this chain IS the greedy walk. Expectation over stored paths of ``E[rounds | y]``
is the true expected number of rounds (unbiased); the confidence interval comes from the
per-sample variance (delta method for the ratio).

The drafter is fed exactly as in serving and in the greedy path: engine-layout slots (target
taps) then its own hidden states along the chain (TTT unroll), the chain fed the path's tokens
(the drafts that were accepted). Target probabilities come from the stored top-k at temperature
1, tempered (:mod:`sampled_target`); where they are not exactly known (T != 1 normalisation, a
stored token outside the top-k) ``r`` is only known to lie in ``[r_lo, r_hi]``; the estimate uses
the midpoint and :func:`expected_rounds` returns a rigorous bound on the resulting error of
``E[rounds | y]``.

Legend: T tokens, P = T - 1 slots, L taps, Dt target hidden, S draft steps, K top-k, V vocabulary.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from osprey_train.evaluation.sampled_target import tempered_target
from osprey_train.ttt.layout import slot_inputs
from osprey_train.ttt.loss import VocabMap
from osprey_train.ttt.unroll import ttt_hidden_states

__all__ = ["SampleRounds", "SampledTally", "acceptance_factors", "draft_path_probs", "expected_rounds",
           "ratio_interval", "sampling_temperature", "store_temperature_reason", "Z95"]

Z95 = 1.959964
"""Two-sided 95% normal quantile."""


@torch.no_grad()
def draft_path_probs(drafter, token_ids_T: Tensor, taps_TLDt: Tensor, steps: int, temperature: float, *,
                     impl: str = "sdpa", chunk: int = 1024) -> Tensor:
    """``q_PS[q, k]``: the drafter's probability (temperature T) of the stored token ``x_{q+2+k}`` at
    chain step ``k`` of the round drafted from slot ``q``, the chain fed ``x_{q+2} ..`` (0 past the end).

    Same layout, attention and self-conditioning as :func:`~osprey_train.evaluation.chain_draft.
    draft_all_positions`; only the fed-back tokens differ (the path's, i.e. the accepted drafts).
    """
    device = next(drafter.parameters()).device
    ids_T = token_ids_T.to(device).long()
    ids_P, taps_PLDt = slot_inputs(ids_T, taps_TLDt.to(device))
    num = ids_P.shape[0]
    out_PS = torch.zeros(num, steps, dtype=torch.float64)
    if num == 0:
        return out_PS
    vocab = VocabMap.from_drafter(drafter.draft_to_target, drafter.config.vocab_size)
    pos_1P = torch.arange(num, device=device)[None]

    def on_step(k: int, hidden_1PD: Tensor) -> None:
        rows = num - 1 - k  # slots q whose step-k token x_{q+2+k} exists
        if rows <= 0:
            return
        want_P = vocab.to_draft(ids_T[2 + k:2 + k + rows])  # -1: not in the draft vocabulary
        for i in range(0, rows, chunk):
            logits_CV = drafter.logits(hidden_1PD[0, i:min(i + chunk, rows)]).float()
            logq_CV = torch.log_softmax(logits_CV / temperature, dim=-1)
            want_C = want_P[i:i + logq_CV.shape[0]]
            got_C = logq_CV.gather(1, want_C.clamp_min(0)[:, None])[:, 0].double().exp()
            out_PS[i:i + got_C.shape[0], k] = torch.where(want_C >= 0, got_C, torch.zeros_like(got_C)).cpu()

    ttt_hidden_states(drafter, ids_P[None], drafter.fuse_taps(taps_PLDt[None]), pos_1P, torch.zeros_like(pos_1P),
                      steps, impl=impl, on_step=on_step)
    return out_PS


def acceptance_factors(q_PS: Tensor, token_ids_T: Tensor, topk_ids_TK: Tensor, topk_logprobs_TK: Tensor,
                       temperature: float, vocab_size: int, prompt_length: int = 0) -> tuple[Tensor, Tensor, list[int], list[int]]:
    """Bounds ``(r_lo_PS, r_hi_PS, outside_S, judged_S)`` of ``r = min(1, q / pT)`` at every slot and step.

    Slot ``q`` step ``k`` judges the stored token ``x_{q+2+k}``, which the target's row ``q+1+k``
    describes. ``judged_S[k]`` counts the step-k factors of the slots that can start a round
    (``q >= prompt_length - 1``), ``outside_S[k]`` those whose token is not in its row's stored top-k.
    """
    P, S = q_PS.shape
    tokens_T = token_ids_T.long().cpu()
    target = tempered_target(topk_logprobs_TK.cpu(), temperature, vocab_size)
    hit_TK = topk_ids_TK.long().cpu()[:-1] == tokens_T[1:, None]  # row t vs token t+1
    inside_T = hit_TK.any(-1)
    p_lo_T = torch.where(inside_T, (target.p_lo_NK[:-1] * hit_TK).sum(-1), torch.zeros(P, dtype=torch.float64))
    p_hi_T = torch.where(inside_T, (target.p_hi_NK[:-1] * hit_TK).sum(-1), target.tail_hi_N[:-1])
    r_lo_PS = torch.zeros(P, S, dtype=torch.float64)
    r_hi_PS = torch.zeros(P, S, dtype=torch.float64)
    outside_S, judged_S = [0] * S, [0] * S
    first = max(int(prompt_length), 1) - 1  # first slot that starts a round
    for k in range(S):
        rows = P - 1 - k
        if rows <= 0:
            break
        judged_S[k] = max(rows - first, 0)
        q_R = q_PS[:rows, k]
        lo_R, hi_R = p_lo_T[1 + k:1 + k + rows], p_hi_T[1 + k:1 + k + rows]
        # min(1, q/p) falls as p grows; q >= p -> 1. The stored token was sampled from the target, so its
        # true p > 0 even where its bound p_lo is 0 (a tail token): q = 0 (e.g. outside a reduced draft
        # vocabulary) gives exactly 0, not the [0, 1] a zero p_lo would suggest.
        r_lo_PS[:rows, k] = torch.where(q_R >= hi_R, torch.ones_like(q_R), q_R / hi_R.clamp_min(1e-300))
        r_hi_PS[:rows, k] = torch.where(q_R <= 0, torch.zeros_like(q_R),
                                        torch.where(q_R >= lo_R, torch.ones_like(q_R), q_R / lo_R.clamp_min(1e-300)))
        outside_S[k] = int((~inside_T[1 + k + first:1 + k + rows]).sum())
    return r_lo_PS, r_hi_PS, outside_S, judged_S


@dataclass
class SampleRounds:
    """Expected verify-round figures of one stored path (given the path)."""

    tokens: int
    """Response tokens yielded by verify rounds (every response token but the prefill's first)."""
    rounds: float
    """``E[rounds | path]`` with the midpoint factors."""
    tail_bound: float
    """Bound on ``|E[rounds | path] - rounds|`` due to the uncertain factors (0 if all are exact)."""
    reached: list[float]
    """Per draft position s: expected rounds in which draft s is judged."""
    accepted: list[float]
    """Per draft position s: expected rounds in which draft s is accepted."""


def expected_rounds(r_lo_PS: Tensor, r_hi_PS: Tensor, num_tokens: int, prompt_length: int,
                    steps: int) -> SampleRounds:
    """Run the round-start Markov chain of one path (module docstring), rounds as :func:`walk_rounds`.

    A round from round start ``p`` (last committed ``x_p``, slot ``p - 1``) compares
    ``min(S, T - 1 - p)`` drafts, accepts ``a`` with ``P(a >= k) = prod_{j<k} r[p-1, j]`` and
    moves to ``p + min(a + 1, T - 1 - p)``. The tail bound: with ``V'`` the expected rounds left
    from each start under the midpoint factors, the error at start ``p`` obeys
    ``e(p) = b(p) + E[e(next)]`` with ``|b(p)| <= TV(p) * (max - min of V' over p's successors)``
    and ``TV(p) <= sum_j (r_hi - r_lo) / 2``; a start is visited at most once, so
    ``|e| <= sum_p |b(p)|``.
    """
    T = int(num_tokens)
    first = max(int(prompt_length), 1)
    r_PS = ((r_lo_PS + r_hi_PS) / 2).tolist()
    half_PS = ((r_hi_PS - r_lo_PS) / 2).tolist()
    tokens = max(T - 1 - first, 0)
    reached, hits = [0.0] * steps, [0.0] * steps
    if tokens == 0:
        return SampleRounds(tokens=0, rounds=0.0, tail_bound=0.0, reached=reached, accepted=hits)

    def transitions(p: int) -> tuple[list[tuple[int, float]], list[float], float]:
        """(next start, probability) pairs, P(a >= k) for k = 0..limit and TV bound of a round at p."""
        remaining = T - 1 - p
        limit = min(steps, remaining)
        at_least = [1.0]
        for j in range(limit):
            at_least.append(at_least[-1] * r_PS[p - 1][j])
        moves = [(p + min(a + 1, remaining), at_least[a] - (at_least[a + 1] if a < limit else 0.0))
                 for a in range(limit + 1)]
        return moves, at_least, min(1.0, sum(half_PS[p - 1][:limit]))

    # backward: V'(p) = expected rounds from start p (0 once the response is complete)
    left = [0.0] * (T + steps + 2)
    bound = 0.0
    for p in range(T - 2, first - 1, -1):
        moves, _, tv = transitions(p)
        left[p] = 1.0 + sum(w * left[n] for n, w in moves)
        if tv > 0:
            succ = [left[n] for n, _ in moves]
            bound += tv * (max(succ) - min(succ))
    # forward: probability that p is a round start; per-position tallies
    start = [0.0] * (T + steps + 2)
    start[first] = 1.0
    for p in range(first, T - 1):
        w_p = start[p]
        if w_p == 0.0:
            continue
        moves, at_least, _ = transitions(p)
        for s in range(len(at_least) - 1):
            reached[s] += w_p * at_least[s]
            hits[s] += w_p * at_least[s + 1]
        for n, w in moves:
            start[n] += w_p * w
    rounds = left[first]
    assert math.isclose(rounds, sum(start[first:T - 1]), rel_tol=1e-9, abs_tol=1e-9), rounds
    return SampleRounds(tokens=tokens, rounds=rounds, tail_bound=bound, reached=reached, accepted=hits)


def ratio_interval(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """``sum(num) / sum(den)`` and its 95% interval from the per-sample variance (delta method)."""
    n = len(num)
    total = sum(den)
    if n == 0 or total <= 0:
        return 0.0, 0.0, 0.0
    ratio = sum(num) / total
    if n < 2:
        return ratio, ratio, ratio
    resid = [a - ratio * b for a, b in zip(num, den)]
    var = sum(d * d for d in resid) / (n - 1)
    half = Z95 * math.sqrt(var / n) / (total / n)
    return ratio, ratio - half, ratio + half


@dataclass
class SampledTally:
    """Per-sample expected rounds pooled into the figures of an acceptance report."""

    steps: int
    samples: dict[str, list[SampleRounds]] = field(default_factory=lambda: defaultdict(list))
    factors: int = 0
    outside: int = 0

    def add(self, domain: str, rounds: SampleRounds) -> None:
        self.samples[domain].append(rounds)

    def all(self) -> list[SampleRounds]:
        return [r for d in sorted(self.samples) for r in self.samples[d]]

    @staticmethod
    def figures(rows: list[SampleRounds]) -> dict:
        """AL with its confidence interval and tail bounds over ``rows``."""
        tokens = [float(r.tokens) for r in rows]
        rounds = [r.rounds for r in rows]
        al, lo, hi = ratio_interval(tokens, rounds)
        total_t, total_r, total_b = sum(tokens), sum(rounds), sum(r.tail_bound for r in rows)
        tail_lo = total_t / (total_r + total_b) if total_r + total_b > 0 else 0.0
        tail_hi = total_t / (total_r - total_b) if total_r - total_b > 0 else float("inf")
        return {"acceptance_length": al, "ci95": [lo, hi], "tail_bounds": [tail_lo, tail_hi],
                "samples": len(rows), "expected_rounds": total_r, "tokens": int(total_t)}

    def per_position(self) -> tuple[list[float], list[list[float]]]:
        """Conditional acceptance rate of each draft position and its 95% interval."""
        rows = self.all()
        rates, cis = [], []
        for s in range(self.steps):
            rate, lo, hi = ratio_interval([r.accepted[s] for r in rows], [r.reached[s] for r in rows])
            rates.append(rate)
            cis.append([lo, hi])
        return rates, cis


def sampling_temperature(header) -> float:
    """The temperature the store's responses were sampled at (0: greedy)."""
    gen = dict(header.generation or {})
    return 0.0 if gen.get("greedy") else float(gen.get("temperature", 0.0) or 0.0)


def store_temperature_reason(header, temperature: float) -> str | None:
    """Why the store's responses are not target samples at ``temperature`` (None when they are).

    Needs: responses generated by the target (``regenerate``), sampled at the same temperature,
    top-p 1 (the estimator and the live harness sample without a nucleus), top-k log-probs at
    temperature 1 (every builder so far: stores without the field hold full-softmax T=1 log-probs).
    """
    gen = dict(header.generation or {})
    if gen.get("regenerate") is False:
        return "its responses were not generated by the target (regenerate = false)"
    stored = sampling_temperature(header)
    if not math.isclose(stored, temperature, rel_tol=0.0, abs_tol=1e-6):
        how = "greedily (temperature 0)" if stored == 0.0 else f"at temperature {stored:g}"
        return f"its responses were sampled {how}, not at the serving temperature {temperature:g}"
    top_p = float(gen.get("top_p", 1.0) or 1.0)
    if top_p < 1.0:
        return f"its responses were sampled with top-p {top_p:g}; the estimator supports top-p 1 only"
    lp_temperature = float(gen.get("topk_logprobs_temperature", 1.0))
    if lp_temperature != 1.0:
        return f"its top-k log-probs are at temperature {lp_temperature:g}; the estimator needs temperature 1"
    return None

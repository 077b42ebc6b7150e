"""The sampled-acceptance estimator against brute-force enumeration of speculative sampling.

A tiny synthetic target (3-token vocabulary; its taps and logits are a recurrent function of the
prefix) and a tiny real drafter. The reference enumerates, with exact probabilities, every draft
chain, accept/reject outcome, residual resample and bonus token of chain speculative sampling as
:func:`~osprey_train.evaluation.verify.verify_sampling` and the live loop run it (rounds and the
token budget as in :func:`~osprey_train.evaluation.spec_decode.speculative_generate`); the
drafter's distributions there come from plain causal attention over the explicit SGLang-style
inputs, not from the offline TTT drafting. The estimator's figures, averaged over every possible
stored response weighted by its probability under the target, must equal the reference's.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import pytest
import torch

from osprey_train.evaluation.acceptance import acceptance_walk
from osprey_train.evaluation.sampled_acceptance import (
    acceptance_factors,
    draft_path_probs,
    expected_rounds,
    ratio_interval,
    store_temperature_reason,
)
from osprey_train.evaluation.sampled_target import tempered_target
from osprey_train.models import CausalAttention, DrafterConfig
from osprey_train.models.io import build_drafter

V, DT, TAPS = 3, 8, 3


class SynthTarget:
    """Target taps (L, Dt) and logits (V) at every position: a recurrent function of the prefix."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(V, DT, generator=g)
        self.w = torch.randn(DT, DT, generator=g) * 0.6
        self.taps = torch.randn(TAPS, DT, DT, generator=g) * 0.5
        self.head = torch.randn(DT, V, generator=g) * 1.5

    def run(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, L, Dt) taps and (T, V) logits of a token sequence."""
        h = torch.zeros(DT)
        taps, logits = [], []
        for t in ids:
            h = torch.tanh(self.w @ h + self.emb[t])
            taps.append(torch.stack([torch.tanh(m @ h) for m in self.taps]))
            logits.append(h @ self.head)
        return torch.stack(taps), torch.stack(logits)


def tiny_drafter(seed: int = 0):
    torch.manual_seed(seed)
    cfg = DrafterConfig.from_name("tiny", vocab_size=V, draft_vocab_size=V, target_hidden_size=DT)
    model = build_drafter(cfg)
    model.reset_parameters()
    with torch.no_grad():
        for p in model.parameters():  # larger weights: drafts that depend on context and chain
            p.normal_(0.0, 0.3) if p.dim() == 2 else None
    return model.eval()


class BruteForce:
    """Exact expectations of chain speculative sampling by enumerating every outcome."""

    def __init__(self, target: SynthTarget, drafter, temperature: float, steps: int, max_new: int) -> None:
        self.target, self.drafter, self.t, self.steps, self.max_new = target, drafter, temperature, steps, max_new
        self.p_cache: dict = {}
        self.q_cache: dict = {}

    def p(self, ids: tuple[int, ...]) -> torch.Tensor:
        if ids not in self.p_cache:
            self.p_cache[ids] = torch.softmax(self.target.run(list(ids))[1][-1].double() / self.t, -1)
        return self.p_cache[ids]

    @torch.no_grad()
    def q(self, ids: tuple[int, ...], chain: tuple[int, ...]) -> torch.Tensor:
        """Drafter distribution after committed ``ids`` and accepted chain drafts, SGLang's inputs."""
        key = (ids, chain)
        if key not in self.q_cache:
            taps = self.target.run(list(ids))[0][:-1]  # c_0 .. c_{p-1}: the committed slots
            d = self.drafter
            cond = list(d.fuse_taps(taps[None].float())[0])
            inp, pos = list(ids[1:]), list(range(len(ids) - 1))
            h = d.forward_hidden(torch.tensor([inp]), torch.stack(cond)[None], torch.tensor([pos]),
                                 CausalAttention())[0, -1]
            for i, tok in enumerate(chain):  # decode: previous draft + own previous hidden state
                inp.append(tok)
                cond.append(h)
                pos.append(len(ids) - 1 + i)
                h = d.forward_hidden(torch.tensor([inp]), torch.stack(cond)[None], torch.tensor([pos]),
                                     CausalAttention())[0, -1]
            self.q_cache[key] = torch.softmax(d.logits(h[None]).double()[0] / self.t, -1)
        return self.q_cache[key]

    def round_outcomes(self, ids: tuple[int, ...], steps: int):
        """[(probability, emitted tokens, accepted drafts)] of one verify round (verify_sampling's rule)."""
        out = []

        def walk(chain: tuple[int, ...], prob: float) -> None:
            p_V = self.p(ids + chain)
            if len(chain) == steps:  # every draft accepted: bonus token from the target
                out.extend((prob * float(p_V[z]), chain + (z,), steps) for z in range(V))
                return
            q_V = self.q(ids, chain)
            reject = 0.0
            for d in range(V):
                if q_V[d] <= 0:
                    continue
                keep = min(1.0, float(p_V[d] / q_V[d]))
                walk(chain + (d,), prob * float(q_V[d]) * keep)
                reject += float(q_V[d]) * (1.0 - keep)
            if reject > 0:
                res_V = (p_V - q_V).clamp_min(0.0)
                res_V = res_V / res_V.sum()
                out.extend((prob * reject * float(res_V[z]), chain + (z,), len(chain)) for z in range(V))

        walk((), 1.0)
        return out

    def expectations(self, prompt: tuple[int, ...]):
        """E[rounds], E[rounds judging draft s], E[rounds accepting draft s] of one generation."""
        S = self.steps

        @lru_cache(maxsize=None)
        def from_state(ids: tuple[int, ...]):
            made = len(ids) - len(prompt)
            room = self.max_new - made
            if room <= 0:
                return (0.0, (0.0,) * S, (0.0,) * S)
            steps = min(S, room)
            rounds, reached, hits = 1.0, [0.0] * S, [0.0] * S
            for prob, emitted, accepted in self.round_outcomes(ids, steps):
                for s in range(min(accepted + 1, steps)):
                    reached[s] += prob
                    hits[s] += prob * (s < accepted)
                r2, re2, h2 = from_state(ids + emitted[:room])
                rounds += prob * r2
                reached = [a + prob * b for a, b in zip(reached, re2)]
                hits = [a + prob * b for a, b in zip(hits, h2)]
            return (rounds, tuple(reached), tuple(hits))

        p0 = self.p(prompt)  # the prefill's first response token
        total = [0.0, [0.0] * S, [0.0] * S]
        for x in range(V):
            r, re, h = from_state(prompt + (x,))
            total[0] += float(p0[x]) * r
            total[1] = [a + float(p0[x]) * b for a, b in zip(total[1], re)]
            total[2] = [a + float(p0[x]) * b for a, b in zip(total[2], h)]
        return total


def estimator_expectations(target, drafter, prompt, temperature, steps, max_new, *, topk=V):
    """The estimator on every possible stored response, weighted by its probability under the target."""
    totals = {"rounds": 0.0, "reached": [0.0] * steps, "hits": [0.0] * steps, "lo": 0.0, "hi": 0.0}
    for resp in itertools.product(range(V), repeat=max_new):
        ids = list(prompt) + list(resp)
        taps, logits = target.run(ids)
        p_TV = torch.softmax(logits.double() / temperature, -1)
        weight = math.prod(float(p_TV[len(prompt) - 1 + i, t]) for i, t in enumerate(resp))
        lp_TV = torch.log_softmax(logits.double(), -1).float()  # stored: temperature 1, fp32
        top_lp, top_ids = lp_TV.topk(topk, -1)
        q_PS = draft_path_probs(drafter, torch.tensor(ids), taps, steps, temperature)
        lo, hi, _, _ = acceptance_factors(q_PS, torch.tensor(ids), top_ids, top_lp, temperature, V, len(prompt))
        r = expected_rounds(lo, hi, len(ids), len(prompt), steps)
        totals["rounds"] += weight * r.rounds
        totals["lo"] += weight * (r.rounds - r.tail_bound)
        totals["hi"] += weight * (r.rounds + r.tail_bound)
        totals["reached"] = [a + weight * b for a, b in zip(totals["reached"], r.reached)]
        totals["hits"] = [a + weight * b for a, b in zip(totals["hits"], r.accepted)]
    return totals


@pytest.mark.parametrize("temperature,steps", [(0.7, 3), (1.0, 2)])
def test_estimator_equals_brute_force_enumeration(temperature, steps):
    target, drafter = SynthTarget(seed=1), tiny_drafter(seed=2)
    prompt, max_new = (0, 2, 1), 4
    truth = BruteForce(target, drafter, temperature, steps, max_new).expectations(prompt)
    est = estimator_expectations(target, drafter, prompt, temperature, steps, max_new)
    assert est["rounds"] == pytest.approx(truth[0], rel=1e-5)
    assert est["reached"] == pytest.approx(truth[1], rel=1e-5)
    assert est["hits"] == pytest.approx(truth[2], rel=1e-5)
    assert 0.1 < truth[2][0] / truth[1][0] < 0.95, "the drafter should be neither useless nor perfect here"


def test_truncated_topk_bounds_contain_the_exact_figure():
    """With K < V the tail makes factors uncertain; the bound must contain the full-vocabulary value."""
    target, drafter = SynthTarget(seed=3), tiny_drafter(seed=4)
    prompt, max_new, steps = (1, 0), 3, 2
    for temperature in (0.7, 1.0, 1.3):
        exact = estimator_expectations(target, drafter, prompt, temperature, steps, max_new)
        cut = estimator_expectations(target, drafter, prompt, temperature, steps, max_new, topk=2)
        assert cut["lo"] - 1e-9 <= exact["rounds"] <= cut["hi"] + 1e-9, temperature
        assert cut["hi"] > cut["lo"]  # the tail is really uncertain at K = 2 of 3


def test_tail_token_the_drafter_cannot_draft_is_rejected_exactly():
    """A stored token outside the top-k has p in (0, p_K]: with q = 0 (outside a reduced draft vocabulary)
    r = min(1, q/p) is exactly 0, not uncertain in [0, 1] (which a midpoint would count as 1/2)."""
    V_, K = 10, 3
    logits_TV = torch.randn(5, V_, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    top_lp, top_ids = torch.log_softmax(logits_TV, -1).float().topk(K, -1)
    outside = [v for v in range(V_) if v not in top_ids[1].tolist()][0]  # row 1 describes token 2
    tokens = torch.tensor([0, 1, outside, 3, 4])
    q_PS = torch.tensor([[0.0], [0.3], [0.2], [0.0]], dtype=torch.float64)  # slot 0 step 0 judges token 2
    for temperature in (0.7, 1.0):
        lo, hi, outside_S, _ = acceptance_factors(q_PS, tokens, top_ids, top_lp, temperature, V_, 1)
        assert outside_S[0] >= 1
        assert lo[0, 0] == 0.0 and hi[0, 0] == 0.0
        q2 = q_PS.clone()
        q2[0, 0] = 1e-4  # q > 0 outside the top-k: genuinely uncertain, up to 1
        lo2, hi2, _, _ = acceptance_factors(q2, tokens, top_ids, top_lp, temperature, V_, 1)
        assert 0.0 < lo2[0, 0] < hi2[0, 0] == 1.0


def test_tempered_target_bounds():
    g = torch.Generator().manual_seed(0)
    logits_NV = torch.randn(6, 50, generator=g, dtype=torch.float64) * 2
    lp_NV = torch.log_softmax(logits_NV, -1)
    top_lp, top_ids = lp_NV.topk(10, -1)
    for temperature in (0.5, 1.0, 1.7):
        exact_NV = torch.softmax(logits_NV / temperature, -1)
        tt = tempered_target(top_lp, temperature, 50)
        exact_NK = exact_NV.gather(1, top_ids)
        assert (tt.p_lo_NK <= exact_NK + 1e-12).all() and (exact_NK <= tt.p_hi_NK + 1e-12).all()
        tail = exact_NV.scatter(1, top_ids, 0.0).max(-1).values
        assert (tail <= tt.tail_hi_N + 1e-12).all()
        if temperature == 1.0:
            assert torch.allclose(tt.p_lo_NK, exact_NK) and torch.allclose(tt.p_hi_NK, exact_NK)


def test_binary_factors_reduce_to_the_greedy_walk():
    """With every factor 0 or 1 the round chain is the deterministic greedy walk, figure for figure."""
    g = torch.Generator().manual_seed(5)
    for trial in range(20):
        T, S, r0 = 12 + trial % 5, 1 + trial % 4, 1 + trial % 3
        tokens = torch.randint(0, 3, (T,), generator=g).tolist()
        drafts_PS = torch.randint(0, 3, (T - 1, S), generator=g).tolist()
        # drafts equal to the path up to the first mismatch accept (r = 1), the first mismatch rejects
        r_PS = torch.zeros(T - 1, S, dtype=torch.float64)
        for q in range(T - 1):
            for k in range(S):
                if q + 2 + k < T and drafts_PS[q][k] == tokens[q + 2 + k]:
                    r_PS[q, k] = 1.0
                else:
                    break
        walk = acceptance_walk(tokens, r0, drafts_PS)
        est = expected_rounds(r_PS, r_PS, T, r0, S)
        assert est.rounds == len(walk) and est.tokens == sum(e for _, e, _ in walk) and est.tail_bound == 0.0
        reached = [sum(1 for a, _, c in walk if s < min(a + 1, c)) for s in range(S)]
        hits = [sum(1 for a, _, c in walk if s < min(a + 1, c) and s < a) for s in range(S)]
        assert est.reached == reached and est.accepted == hits


def test_ratio_interval():
    al, lo, hi = ratio_interval([10.0, 12.0, 8.0, 11.0], [5.0, 4.0, 4.0, 5.0])
    assert al == pytest.approx(41 / 18) and lo < al < hi
    assert ratio_interval([3.0], [2.0]) == (1.5, 1.5, 1.5)


class _Header:
    def __init__(self, **generation):
        self.generation = generation


@pytest.mark.parametrize("generation,requested,fragment", [
    ({"greedy": True, "temperature": 0.0}, 0.7, "greedily"),
    ({"greedy": False, "temperature": 1.0, "top_p": 1.0}, 0.7, "at temperature 1"),
    ({"greedy": False, "temperature": 0.7, "top_p": 0.9}, 0.7, "top-p 0.9"),
    ({"regenerate": False, "temperature": 0.7}, 0.7, "not generated by the target"),
    ({"greedy": False, "temperature": 0.7, "top_p": 1.0, "topk_logprobs_temperature": 0.7}, 0.7, "log-probs"),
])
def test_store_temperature_reason(generation, requested, fragment):
    assert fragment in store_temperature_reason(_Header(**generation), requested)


def test_store_temperature_reason_accepts_a_matching_store():
    assert store_temperature_reason(_Header(greedy=False, temperature=0.7, top_p=1.0), 0.7) is None
    # stores from builders before the field existed hold temperature-1 log-probs
    assert store_temperature_reason(_Header(greedy=False, temperature=1.0, top_p=1.0,
                                            topk_logprobs_temperature=1.0), 1.0) is None

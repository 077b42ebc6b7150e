"""``--steps auto``: the draft length S of each speculative round, chosen from step costs and the
running acceptance, so that speculation never costs more than it buys.

A chain round of ``S`` drafts costs (in plain decode steps, :class:`~osprey_train.evaluation.cost_model.CostModel`)
``S * draft_step + verify(S + 1) + round_overhead`` and emits, in expectation,

    E(S) = 1 + sum_{j=1..S} prod_{k=1..j} p_k

tokens, where ``p_k = P(draft k accepted | drafts 1..k-1 accepted)``. ``S = 0`` is plain decoding:
a verify of the last committed token alone, cost ``verify(1)``, one token. Each round
:meth:`DraftLengthPolicy.choose` takes the ``S`` in ``0 .. max_steps`` with the most expected tokens
per unit of cost, from :class:`PositionAcceptance` (a Beta estimate per draft position, with a prior
and a mild forgetting, updated after every round by :meth:`DraftLengthPolicy.observe`).

When ``S = 0`` wins nothing is drafted, so nothing would be learnt. Two rules keep learning:

- while the evidence is thin, a round drafts whenever an optimistic estimate (each position's
  posterior mean plus ``optimism`` posterior standard deviations) says drafting would pay: a few
  early rejections do not stop a drafter whose true acceptance is above break-even (the quick
  demo's drafter, ~0.12 against a break-even of ~0.08, was stopped after 8 rounds at an estimate of
  0.06 and never tried again), while a drafter that never agrees is dropped after ~15 rounds, once
  its estimate is certain;
- after ``probe_after`` plain rounds in a row one round drafts the best ``S >= 1`` anyway (a probe),
  and the wait doubles after every probe that leaves plain decoding the better choice (up to
  ``probe_max``), so a drafter that starts to agree later (another domain) is noticed.

The choice never changes the output: greedy verification is lossless for every ``S``.

:func:`measure_costs` measures the costs on the run's own target and drafter when no cost file is
given: the target's verify forward per block size and the drafter's round (one new slot, then S
drafts), through the same public calls the decoding loop makes.

Legend: S draft steps, T tokens, L taps, Dt target hidden.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from osprey_data.errors import ConfigError
from osprey_train.evaluation.cost_model import CostModel

__all__ = ["AUTO", "DraftLengthPolicy", "PositionAcceptance", "expected_tokens", "measure_costs",
           "parse_steps", "steps_option"]

AUTO = "auto"


def parse_steps(text: Any) -> int | str:
    """``--steps``: ``auto`` or a positive integer (a fixed draft length)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        text = str(text).strip().lower()
        if text == AUTO:
            return AUTO
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"--steps must be 'auto' or a positive integer, got {text!r}") from None
    if value < 1:
        raise ConfigError(f"--steps must be 'auto' or a positive integer, got {value}")
    return value


def steps_option(text: str) -> int | str:
    """The command line's ``--steps`` value as typed (an integer, or the word): the config checks it,
    so a bad value is the one-line ``live: --steps ...`` error, not a click usage block."""
    text = str(text).strip()
    try:
        return int(text)
    except ValueError:
        return text.lower()


def expected_tokens(rates: Sequence[float], steps: int) -> float:
    """Expected tokens of one round of ``steps`` drafts: the target's own token plus each draft
    that is reached and accepted (``rates[k]`` = P(draft k+1 accepted | the drafts before it were))."""
    total, reach = 1.0, 1.0
    for k in range(steps):
        reach *= rates[k]
        total += reach
    return total


@dataclass(kw_only=True)
class PositionAcceptance:
    """Beta estimates of ``P(draft k accepted | drafts before it accepted)`` for k = 1..max_steps."""

    max_steps: int
    """Draft positions estimated."""
    prior_mean: float = 0.5
    """Prior acceptance at position 1 (later positions: the estimate of the one before): 0.5, an
    agnostic start that makes a first round draft wherever a 50 % drafter would pay, and is
    overturned after a few rounds of evidence."""
    prior_strength: float = 1.0
    """Pseudo-observations of the prior (1: Jeffreys' Beta(0.5, 0.5) at mean 0.5, which a few rounds
    overturn: four rejections in a row bring position 1 to 0.1)."""
    decay: float = 0.99
    """Each new observation at a position first scales that position's evidence by this factor,
    so the estimate follows a drafter whose acceptance changes (another domain, a long answer):
    about the last 1 / (1 - decay) = 100 observations count."""
    hits: list[float] = field(init=False)
    """Decayed accepted count per position."""
    seen: list[float] = field(init=False)
    """Decayed judged count per position."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ConfigError(f"draft length: max_steps must be >= 1, got {self.max_steps}")
        if not (0.0 < self.prior_mean < 1.0) or self.prior_strength <= 0 or not (0.0 < self.decay <= 1.0):
            raise ConfigError("draft length: prior_mean must be in (0, 1), prior_strength > 0, decay in (0, 1]")
        self.hits = [0.0] * self.max_steps
        self.seen = [0.0] * self.max_steps

    def rates(self, optimism: float = 0.0) -> list[float]:
        """The posterior mean at every position, plus ``optimism`` posterior standard deviations
        (capped at 1). Position 1's prior is ``prior_mean``; position k's is position k-1's mean,
        since acceptance changes slowly along a chain: a position never drafted yet is expected to do
        what the one before it does, so a drafter that is right at position 3 gets position 4 tried,
        and one that is wrong at 1 is not expected to be right at 2."""
        out, mean = [], self.prior_mean
        for h, n in zip(self.hits, self.seen):
            weight = self.prior_strength + n
            mean = (mean * self.prior_strength + h) / weight
            # the Beta(mean * weight, (1 - mean) * weight) posterior's standard deviation
            spread = (mean * (1.0 - mean) / (weight + 1.0)) ** 0.5 if optimism else 0.0
            out.append(min(1.0, mean + optimism * spread))
        return out

    def observe(self, drafted: int, accepted: int) -> None:
        """One verify round: drafts ``1..accepted`` were accepted, draft ``accepted + 1`` (if drafted)
        rejected, the later ones never judged."""
        for k in range(min(drafted, accepted + 1, self.max_steps)):
            self.hits[k] = self.hits[k] * self.decay + (1.0 if k < accepted else 0.0)
            self.seen[k] = self.seen[k] * self.decay + 1.0


@dataclass(kw_only=True)
class DraftLengthPolicy:
    """Chooses the draft length of every round (see the module docstring); one per live run, so what
    the first prompts taught carries over to the next ones."""

    cost: CostModel
    """Step costs, in plain decode steps."""
    max_steps: int
    """The most drafts a round may have (the drafter's maximum: ``--max-steps``)."""
    probe_after: int = 8
    """Plain rounds in a row before a probe round drafts anyway (then 16, 32, ...: short answers pay
    few probes)."""
    probe_max: int = 256
    """The longest wait between probes (the wait doubles after every probe that changes nothing)."""
    optimism: float = 1.0
    """Posterior standard deviations added to the acceptance estimate when plain decoding looks
    best: if the optimistic estimate still says drafting would pay, the round drafts (0: never)."""
    acceptance: PositionAcceptance | None = None
    """The running acceptance estimate (default: :class:`PositionAcceptance`'s prior)."""
    used: Counter = field(init=False, default_factory=Counter)
    """S -> rounds that drafted S."""
    probes: int = field(init=False, default=0)
    """Rounds that drafted although S = 0 was the better choice even optimistically (the backoff probes)."""
    explored: int = field(init=False, default=0)
    """Rounds that drafted because the optimistic estimate said drafting might pay, S = 0 the mean's choice."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ConfigError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.probe_after < 1 or self.probe_max < self.probe_after:
            raise ConfigError("draft length: probe_after must be >= 1 and probe_max >= probe_after")
        if self.optimism < 0:
            raise ConfigError(f"draft length: optimism must be >= 0, got {self.optimism}")
        if self.acceptance is None:
            self.acceptance = PositionAcceptance(max_steps=self.max_steps)
        # every cost the choice can need, once: a cost table that misses a block size fails here, not mid-run
        self.round_costs = [self.cost.verify_cost(1)] + [
            s * self.cost.draft_cost(1) + self.cost.verify_cost(s + 1) + self.cost.round_overhead
            for s in range(1, self.max_steps + 1)]
        self._plain_run = 0
        self._wait = self.probe_after

    def rates(self, room: int, optimism: float = 0.0) -> list[float]:
        """Expected tokens per plain step for S = 0 .. the longest useful S (``optimism``: see
        :meth:`PositionAcceptance.rates`)."""
        assert self.acceptance is not None
        p = self.acceptance.rates(optimism)
        # a draft past the budget's last token can never be emitted: room - 1 drafts at most
        longest = max(0, min(self.max_steps, room - 1))
        return [expected_tokens(p, s) / self.round_costs[s] for s in range(longest + 1)]

    def choose(self, room: int) -> int:
        """The draft length of the next round, with ``room`` tokens left in the budget."""
        rates = self.rates(room)
        best = max(range(len(rates)), key=lambda s: (rates[s], -s))   # ties: the shorter round
        if best == 0 and len(rates) > 1 and self.optimism > 0:
            hopeful = self.rates(room, self.optimism)
            best = max(range(len(hopeful)), key=lambda s: (hopeful[s], -s))
            self.explored += best > 0
        if best == 0 and len(rates) > 1:
            self._plain_run += 1
            if self._plain_run >= self._wait:
                self._plain_run = 0
                self._wait = min(2 * self._wait, self.probe_max)
                self.probes += 1
                best = max(range(1, len(rates)), key=lambda s: (rates[s], -s))
        elif best > 0:
            self._plain_run, self._wait = 0, self.probe_after
        self.used[best] += 1
        return best

    def observe(self, drafted: int, accepted: int) -> None:
        """The outcome of a round that drafted ``drafted`` tokens."""
        assert self.acceptance is not None
        if drafted > 0:
            self.acceptance.observe(drafted, accepted)

    def to_dict(self) -> dict[str, Any]:
        """For the report: the costs, the S histogram and the final estimates."""
        assert self.acceptance is not None
        return {"mode": AUTO, "max_steps": self.max_steps, "rounds_by_steps": {int(s): n for s, n in
                                                                              sorted(self.used.items())},
                "probes": self.probes, "explored": self.explored, "round_costs": [round(c, 4) for c in self.round_costs],
                "acceptance_estimate": [round(r, 4) for r in self.acceptance.rates()],
                "cost": {**self.cost.to_dict(), "source": self.cost.source}}


def measure_costs(target, drafter, context_ids: Sequence[int], max_steps: int, *, repeats: int = 5,
                  device: str = "", what: str = "") -> CostModel:
    """Step costs of this target and drafter, measured here (a second or two on a small CPU model).

    The target: a plain one-token step (the unit) and a verify forward with taps over ``n`` new
    tokens after the context, ``n = 1 .. max_steps + 1`` (medians of ``repeats`` interleaved runs).
    The drafter, through :meth:`DraftSession.propose` only: after a first call over the context,
    each call brings one new committed position (a round that accepted nothing) and drafts 1 or
    ``max_steps`` tokens, alternately; the difference is the marginal draft step, the rest of the
    one-draft call (the extend of one slot, Python) the round overhead.
    """
    ids = [int(t) for t in context_ids]
    calls = 2 * repeats + 2   # drafter calls, one new committed position each
    base = max(8, len(ids) - calls - 1)
    if len(ids) < base + calls + 1:
        ids = (ids * (1 + (base + calls + 1) // max(1, len(ids))))[: base + calls + 1]
    block = [ids[(3 * i + 1) % len(ids)] for i in range(max_steps + 1)]   # any tokens: only the time counts
    target.reset(capacity=len(ids) + max_steps + 2)
    _, taps_TLDt = target.forward(ids[:-1], want_taps=True, logits_for=1)
    past = target.length

    def forward(n: int, want_taps: bool) -> None:
        target.forward(block[:n], want_taps=want_taps, logits_for=None if want_taps else 1)
        target.crop(past)

    forward(1, False), forward(max_steps + 1, True)   # warm-up
    samples: dict[tuple[str, int], list[float]] = {}
    order = [("plain", 1)] + [("verify", n) for n in range(1, max_steps + 2)]
    for rep in range(repeats):
        for kind, n in (order if rep % 2 == 0 else order[::-1]):   # drift hits every size alike
            start = time.perf_counter()
            forward(n, kind == "verify")
            samples.setdefault((kind, n), []).append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in samples.items()}
    plain = med[("plain", 1)]
    drafter.reset()
    drafter.propose(ids[:base + 1], taps_TLDt[:base], 1, 0.0, None)   # the prefill's extend, not timed
    draft_times: dict[int, list[float]] = {1: [], max_steps: []}
    for i in range(calls):
        end = base + 2 + i   # one more committed token than the previous call
        steps = 1 if i % 2 else max_steps
        start = time.perf_counter()
        drafter.propose(ids[:end], taps_TLDt[end - 2: end - 1], steps, 0.0, None)
        if i >= 2:   # the first two calls warm up
            draft_times[steps].append(time.perf_counter() - start)
    one = statistics.median(draft_times[1])
    if max_steps > 1:
        step = max(0.0, (statistics.median(draft_times[max_steps]) - one) / (max_steps - 1))
    else:
        step = one
    target.reset()
    drafter.reset()
    return CostModel(device=device or "measured at the start of the run",
                     draft_step=round(step / plain, 4),
                     verify={n: round(med[("verify", n)] / plain, 4) for n in range(1, max_steps + 2)},
                     round_overhead=round(max(0.0, one - step) / plain, 4), plain_step_seconds=round(plain, 6),
                     source=what or "measured at the start of the run")

"""Engine counters beside Osprey's offline and live figures, one prompt at a time.

Counting (greedy chain drafting of S tokens, one verify round per engine step after the prefill):

* a **round** is one verify step; vLLM's ``num_drafts`` counts them, as our offline walk
  (:func:`~osprey_train.evaluation.acceptance.acceptance_walk`) and our live harness do;
* ``accepted_per_pos[s]`` is the number of rounds whose draft ``s`` (0-based) was accepted, i.e.
  rounds with at least ``s + 1`` accepted drafts (vLLM's ``num_accepted_tokens_per_pos``);
* SGLang's per-request ``meta_info`` gives the same two figures: ``spec_verify_ct`` (rounds) and
  ``spec_accept_histogram`` (rounds per number of accepted drafts), from which
  ``accepted_per_pos`` follows (:mod:`sglang_driver`);
* **the end-of-request overcount**: vLLM compares all S drafts of a round with the target's greedy
  tokens and counts the matches *before* cutting the output at ``max_tokens`` or a stop token.
  SGLang does the same (read in its source at the rig's snapshot: its greedy tree verify looks at
  neither, and the scheduler trims the output after counting). In the last round of a request,
  drafts matching the target's continuation past the end are counted although they were never
  emitted. Our definition counts at most the tokens the round emitted. So, per request: ``ours =
  the engine's - overcount``, where the overcount can only sit in the last round, only when that
  round accepted every draft up to the end (``a_last`` = the tokens left), and only at draft
  positions ``a_last, a_last + 1, ...``: exactly ``k`` consecutive positions, ``k = sum(engine's
  accepted) - sum(ours)``;
* **the engine's own consistency**: whatever the drafts, the prefill emits one token and every
  round ``a + 1``, of which the last round loses at most S to the cut, so ``0 <= 1 + rounds +
  accepted - tokens <= S`` (no round: at most the prefill's token). This needs nothing of ours:
  it checks that the counters were read right even where the engine's outputs are wrong.

:func:`reconcile` applies exactly that rule: the engine's per-position counts of a prompt must
equal ours plus one contiguous block at the last round's position; anything else is a disagreement
(a wrong tap order, a wrong ``d2t``, a numerics difference) and is reported as one.

**Round by round**, where the engine's counts come per verify round (``accepted_per_round``: the vLLM
driver steps the engine itself and reads its counters after every step, one request in flight, so
each step is one round): every round must accept exactly what our round accepted, the last one
plus the overcount. Per-position totals can agree while rounds do not (two rounds that swap their
counts); the first round that differs is named (:func:`first_round_difference`). SGLang reports a
histogram per request, not a sequence, so its comparison stays per position.

Legend: S draft steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PromptComparison", "counts_from_rounds", "counters_consistent", "reconcile", "first_difference",
           "first_round_difference"]


def counts_from_rounds(accepted: list[int], steps: int) -> list[int]:
    """Per draft position ``s``: rounds with more than ``s`` accepted drafts."""
    return [sum(1 for a in accepted if a > s) for s in range(steps)]


def counters_consistent(tokens: int, rounds: int, accepted: int, steps: int) -> bool:
    """An engine's counters against the tokens it returned (this module's docstring)."""
    if rounds == 0:
        return accepted == 0 and tokens <= 1
    return 0 <= 1 + rounds + accepted - tokens <= steps


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def first_round_difference(engine: list[int], ours: list[int], overcount: int) -> int | None:
    """0-based index of the first round whose accepted drafts differ, the engine's last round allowed
    ``overcount`` more than ours (this module's docstring); the shorter length when one sequence is a
    prefix of the other; None when every round agrees."""
    expected = list(ours)
    if expected:
        expected[-1] += overcount
    return first_difference(engine, expected)


@dataclass
class PromptComparison:
    """One prompt: the engine's counters against ours (offline walk, live harness)."""

    id: str
    domain: str
    steps: int
    tokens: int
    """Output tokens of the engine with speculation (the prefill's token included)."""
    engine_rounds: int
    offline_rounds: int
    offline_emitted: int
    """Tokens our offline rounds emit (the response minus the prefill's token)."""
    engine_per_pos: list[int]
    """vLLM's ``num_accepted_tokens_per_pos`` for this request (with the overcount)."""
    offline_per_pos: list[int]
    overcount: int
    """Drafts vLLM counted accepted past the request's end (max_tokens / stop token)."""
    overcount_per_pos: list[int]
    agrees: bool
    """Engine rounds equal ours and engine counts = ours + the overcount block, exactly (and the
    engine's counters are consistent with its output length)."""
    counters_consistent: bool = True
    """``0 <= 1 + rounds + accepted - tokens <= S`` for the engine's own figures."""
    live_rounds: int | None = None
    live_per_pos: list[int] | None = None
    identical: dict[str, bool] = field(default_factory=dict)
    """Greedy outputs: engine with vs without speculation, engine vs the store (transformers), live."""
    why: str = ""
    """What disagrees, when something does."""
    engine_per_round: list[int] | None = None
    """The engine's accepted drafts in each verify round (the overcount in the last), where it reports
    them (vLLM); None where it does not (SGLang)."""
    offline_per_round: list[int] = field(default_factory=list)
    first_round_differing: int | None = None
    """1-based round where the engine's accepted drafts first leave ours; None when all agree or
    the engine gives no per-round counts."""

    @property
    def engine_reconciled(self) -> list[int]:
        return [e - o for e, o in zip(self.engine_per_pos, self.overcount_per_pos)]

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["engine_reconciled"] = self.engine_reconciled
        return doc


def reconcile(*, sample_id: str, domain: str, steps: int, tokens: int, engine: dict, walk: list[tuple[int, int, int]],
              live_accepted: list[int] | None = None, identical: dict[str, bool] | None = None) -> PromptComparison:
    """Compare one request's engine counters with our offline walk (``(accepted, emitted, compared)``
    per round) under the overcount rule of this module's docstring."""
    ours_acc = [a for a, _, _ in walk]
    offline = counts_from_rounds(ours_acc, steps)
    engine_pos = [int(v) for v in engine["accepted_per_pos"]][:steps]
    engine_pos += [0] * (steps - len(engine_pos))
    k = sum(engine_pos) - sum(offline)
    block = [0] * steps
    why = []
    consistent = counters_consistent(tokens, int(engine["num_drafts"]), sum(engine_pos), steps)
    if not consistent:
        why.append(f"engine counters ({engine['num_drafts']} rounds, {sum(engine_pos)} accepted) do not add up to "
                   f"its {tokens} output tokens")
    if int(engine["num_drafts"]) != len(walk):
        why.append(f"{engine['num_drafts']} engine rounds vs {len(walk)} offline")
    if walk and k > 0:
        a_last, emitted_last, _ = walk[-1]
        ended_full = a_last == emitted_last  # every draft up to the end accepted (the bonus token was cut)
        if not ended_full or a_last + k > steps:
            why.append(f"{k} more accepted drafts than ours, not at the end of the request")
        else:
            block = [1 if a_last <= s < a_last + k else 0 for s in range(steps)]
    elif k < 0:
        why.append(f"{-k} fewer accepted drafts than ours")
    if not why and [e - b for e, b in zip(engine_pos, block)] != offline:
        why.append("accepted drafts per position differ")
    per_round = engine.get("accepted_per_round")
    first_round = None
    if per_round is not None:
        per_round = [int(a) for a in per_round]
        if len(per_round) != int(engine["num_drafts"]) or sum(per_round) != sum(engine_pos):
            why.append(f"the engine's {len(per_round)} per-round counts (sum {sum(per_round)}) do not add up to its "
                       f"{engine['num_drafts']} rounds and {sum(engine_pos)} accepted drafts")
        diff = first_round_difference(per_round, ours_acc, sum(block))
        if diff is not None:
            first_round = diff + 1
            engine_a = per_round[diff] if diff < len(per_round) else "no round"
            ours_a = ours_acc[diff] if diff < len(ours_acc) else "no round"
            why.append(f"round {first_round} of {len(ours_acc)} differs first: the engine accepted {engine_a}, "
                       f"ours {ours_a}")
    live_pos = None if live_accepted is None else counts_from_rounds(live_accepted, steps)
    return PromptComparison(
        id=sample_id, domain=domain, steps=steps, tokens=tokens, engine_rounds=int(engine["num_drafts"]),
        offline_rounds=len(walk),
        offline_emitted=sum(e for _, e, _ in walk), engine_per_pos=engine_pos, offline_per_pos=offline, overcount=max(k, 0) if not why else 0,
        overcount_per_pos=block, agrees=not why, counters_consistent=consistent,
        live_rounds=None if live_accepted is None else len(live_accepted),
        live_per_pos=live_pos, identical=dict(identical or {}), why="; ".join(why), engine_per_round=per_round,
        offline_per_round=ours_acc, first_round_differing=first_round)

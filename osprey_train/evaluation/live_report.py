"""The live report: per-prompt decoding records pooled into acceptance, per-domain and speed figures.

Acceptance length is counted as SGLang counts it and as the offline walk does
(:mod:`osprey_train.evaluation.acceptance`): tokens emitted by verify rounds / verify rounds, the
prefill's first response token belonging to no round; the per-position rates come from the same
function as the offline report's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from osprey_data.text import printable
from osprey_train.evaluation.acceptance import per_position_rates

__all__ = ["LiveReport", "draft_length_line", "first_divergence", "lossless_line", "speedup_text", "summarize"]


def speedup_text(speedup: float | None, *, what: str = "plain decoding") -> str:
    """``speedup x1.31``; below 1 it says, next to the figure, that speculation was slower (issue 48:
    ``speedup x0.56`` alone reads as a gain)."""
    if speedup is None:
        return "speedup n/a"
    if speedup < 1:
        return f"speedup x{speedup:.2f} (slower than {what})"
    return f"speedup x{speedup:.2f}"


def draft_length_line(draft_length: dict[str, Any] | None, speedup: float | None) -> str | None:
    """``--steps auto``: which S the rounds used, how often, and the speedup they gave; None for a fixed S."""
    if not draft_length:
        return None
    rounds = draft_length["rounds_by_steps"]
    total = sum(rounds.values()) or 1
    used = ", ".join(f"S={s} in {n} ({100 * n / total:.0f}%)" for s, n in sorted(rounds.items(), key=lambda x: int(x[0])))
    cost = draft_length.get("cost", {})
    source = cost.get("source") or cost.get("device") or "?"
    return (f"Draft length: auto (S = 0..{draft_length['max_steps']}, 0 = a plain step; costs {source}): "
            f"{used or 'no rounds'} of {sum(rounds.values())} rounds ({draft_length.get('probes', 0)} probes, "
            f"{draft_length.get('explored', 0)} explored); "
            f"{speedup_text(speedup)}")


def first_divergence(spec_ids: list[int], plain_ids: list[int]) -> int | None:
    """The first position where two outputs differ (the shorter one's length if one is a prefix
    of the other), or None when they are identical."""
    for i, (a, b) in enumerate(zip(spec_ids, plain_ids)):
        if a != b:
            return i
    return None if len(spec_ids) == len(plain_ids) else min(len(spec_ids), len(plain_ids))


def lossless_line(identical: int | None, total: int, divergences: list[int] | None = None) -> str:
    """``identical k/n``, and when k < n, the loud statement that the output is not lossless."""
    if identical is None:
        return "identical: not checked (sampling, or no plain baseline)"
    if identical == total:
        return f"identical {identical}/{total}"
    where = f"; first divergence at token {min(divergences)}" if divergences else ""
    return (f"identical {identical}/{total}: NOT LOSSLESS (speculative output differs from plain decoding{where}); "
            f"a speedup over it does not count")


@dataclass
class LiveReport:
    """Figures of one live run (``to_dict`` is what ``--json`` prints)."""

    num_prompts: int
    steps: int
    temperature: float
    acceptance_length: float
    """Tokens emitted by verify rounds / verify rounds over all prompts (SGLang's accept length:
    the first response token comes from the prefill and belongs to no round)."""
    per_domain: dict[str, dict[str, float]]
    """domain -> acceptance_length, prompts, tokens, verify_tokens, verify_steps."""
    per_position: list[float]
    """k -> P(draft k accepted | drafts before it accepted), the offline report's definition."""
    spec_tokens: int
    """Tokens generated with the drafter (the prefill's first token included)."""
    verify_tokens: int
    """Of those, the tokens emitted by verify rounds."""
    verify_steps: int
    """Verify rounds."""
    spec_seconds: float
    plain_tokens: int | None
    plain_seconds: float | None
    greedy_identical: int | None
    """Prompts whose speculative output equals plain greedy output (greedy runs with baseline)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """Per prompt: id, domain, tokens, verify_steps, accept_lengths, identical."""
    target: str = ""
    drafter: str = ""
    precision: dict[str, str] = field(default_factory=dict)
    """The precisions the run used: ``{"target": ..., "drafter": ...}`` (``auto`` resolved)."""
    exactness: dict[str, Any] = field(default_factory=dict)
    """What makes the verify rows exact here (:meth:`HFTargetSession.make_rows_exact`): its
    ``summary`` and the linears' plans."""
    tree: dict | None = None
    """Tree drafting: ``{steps, topk, num_draft_tokens, kv}``; None = chain drafting of ``steps``."""
    draft_length: dict[str, Any] | None = None
    """``--steps auto``: the rounds per draft length S, the costs and the final acceptance estimates
    (:meth:`DraftLengthPolicy.to_dict`; ``steps`` is then the most S); None = a fixed S every round."""

    @property
    def spec_tokens_per_s(self) -> float:
        return self.spec_tokens / self.spec_seconds if self.spec_seconds else 0.0

    @property
    def plain_tokens_per_s(self) -> float | None:
        if self.plain_tokens is None or not self.plain_seconds:
            return None
        return self.plain_tokens / self.plain_seconds

    @property
    def lossless(self) -> bool | None:
        """Every greedy output identical to plain decoding (None: not checked)."""
        return None if self.greedy_identical is None else self.greedy_identical == self.num_prompts

    @property
    def divergences(self) -> list[int]:
        """First divergent token of each prompt whose output differs from plain decoding."""
        return [s["first_divergence"] for s in self.samples if s.get("first_divergence") is not None]

    @property
    def speedup(self) -> float | None:
        plain = self.plain_tokens_per_s
        return self.spec_tokens_per_s / plain if plain else None

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.update(spec_tokens_per_s=self.spec_tokens_per_s, plain_tokens_per_s=self.plain_tokens_per_s,
                   speedup=self.speedup, lossless=self.lossless)
        return doc

    def to_markdown(self) -> str:
        how = (f"S=auto (0..{self.steps})" if self.draft_length else f"S={self.steps}") if self.tree is None else (
            f"tree steps={self.tree['steps']} topk={self.tree['topk']} "
            f"num_draft_tokens={self.tree['num_draft_tokens']}")
        lines = [
            f"Live speculative decoding: {self.num_prompts} prompts, {how}, "
            f"temperature={self.temperature:g}"
            + (f", precision target={self.precision.get('target')} drafter={self.precision.get('drafter')}"
               if self.precision else ""),
            "",
            "| domain | prompts | tokens | from verify rounds | verify rounds | acceptance length |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for domain, row in sorted(self.per_domain.items()):
            lines.append(f"| {domain} | {row['prompts']:.0f} | {row['tokens']:.0f} | {row['verify_tokens']:.0f} | "
                         f"{row['verify_steps']:.0f} | {row['acceptance_length']:.3f} |")
        lines.append(f"| **all** | {self.num_prompts} | {self.spec_tokens} | {self.verify_tokens} | "
                     f"{self.verify_steps} | **{self.acceptance_length:.3f}** |")
        lines.append("")
        lines.append("Per-position acceptance: " + ", ".join(f"{k + 1}: {r:.3f}" for k, r in enumerate(self.per_position)))
        speed = f"speculative {self.spec_tokens_per_s:.1f} tok/s"
        if self.plain_tokens_per_s is not None:
            speed += (f", target alone {self.plain_tokens_per_s:.1f} tok/s, {speedup_text(self.speedup)}, "
                      + lossless_line(self.greedy_identical, self.num_prompts, self.divergences))
        lines.append(speed)
        auto = draft_length_line(self.draft_length, self.speedup)
        if auto is not None:
            lines.append(auto)
        if self.greedy_identical is not None:
            lines.append(f"Greedy outputs identical to plain decoding: {self.greedy_identical}/{self.num_prompts}"
                         + ("" if self.lossless else " (NOT LOSSLESS)"))
        if self.exactness.get("summary"):
            lines.append(f"Verify rows: {self.exactness['summary']}")
        return "\n".join(printable(line) for line in lines) + "\n"  # domains come from the prompt files


def summarize(samples: list[dict[str, Any]], *, steps: int, temperature: float, baseline: bool) -> LiveReport:
    """Pool per-prompt records into a :class:`LiveReport`."""
    per_domain: dict[str, dict[str, float]] = {}
    for domain in sorted({s["domain"] for s in samples}):
        rows = [s for s in samples if s["domain"] == domain]
        verified = sum(sum(s["accept_lengths"]) for s in rows)
        verify = sum(s["verify_steps"] for s in rows)
        per_domain[domain] = {"prompts": len(rows), "tokens": sum(s["tokens"] for s in rows),
                              "verify_tokens": verified, "verify_steps": verify,
                              "acceptance_length": verified / verify if verify else 0.0}
    tokens = sum(s["tokens"] for s in samples)
    verified = sum(sum(s["accept_lengths"]) for s in samples)
    verify = sum(s["verify_steps"] for s in samples)
    # the offline report's definition, from the same function: a draft is judged when the position it
    # proposes was emitted by its round (the response's end, an EOS or the budget can cut the round)
    per_position = per_position_rates(((a, min(drafted, emitted)) for s in samples
                                       for a, drafted, emitted in zip(s["accepted"], s["drafted"],
                                                                      s["accept_lengths"])), steps)
    spec_seconds = sum(s["seconds"] for s in samples)
    plain_seconds = sum(s["plain_seconds"] for s in samples) if baseline else None
    identical = None
    if baseline and temperature <= 0:
        identical = sum(bool(s["identical"]) for s in samples)
    return LiveReport(num_prompts=len(samples), steps=steps, temperature=temperature,
                      acceptance_length=verified / verify if verify else 0.0, per_domain=per_domain,
                      per_position=per_position, spec_tokens=tokens, verify_tokens=verified,
                      verify_steps=verify, spec_seconds=spec_seconds,
                      plain_tokens=sum(s["plain_tokens"] for s in samples) if baseline else None,
                      plain_seconds=plain_seconds, greedy_identical=identical, samples=samples)

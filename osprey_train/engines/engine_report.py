"""The report of ``osprey eval engine``: the engine's counters beside ours, per position and per prompt.

Figures, per export (one speculative engine run):

- **rounds**: verify rounds counted by the engine (``num_drafts``), by our offline walk and by our
  live harness;
- **accepted drafts per position** ``s``: rounds whose draft ``s`` was accepted — the engine's
  raw count, its end-of-request overcount (:mod:`compare`), the engine's count minus the
  overcount, ours offline and ours live. "agrees" means: equal rounds and engine − overcount =
  offline, for every prompt;
- **acceptance length**: ours = tokens emitted by verify rounds / rounds; vLLM's own "mean
  acceptance length" = 1 + accepted drafts / drafts, overcount included; SGLang's own
  ``spec_accept_length`` = completion tokens / verify rounds (the prefill's token included);
- **losslessness**, the first verdict: per prompt, the engine's output with speculation = its
  output without. Where it fails the engine verified a continuation that is not the target's, so
  its acceptance counts check nothing (SGLang's CPU engine at the rig's snapshot): the export is
  reported **not lossless**, never as agreeing;
- **greedy outputs**: per prompt, engine with speculation = engine without = the store's
  (transformers) response = our live harness's. A prompt is *comparable* when all are identical:
  only there do the engine's counters and ours count the same continuation (in bf16 a near-tie
  can flip a token between kernels; the prompts it hits are listed, not counted as agreement);
- **batched** (SGLang, whose counters are per request in a batch too): the same comparison for
  the batched pass;
- **speed**: the engine's tokens/s one request at a time (single stream) and all prompts batched,
  with and without speculation.

``write`` puts ``report.md`` and ``report.json`` into the run folder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.atomic import write_json, write_text
from osprey_data.text import printable
from osprey_train.engines.compare import PromptComparison

__all__ = ["EngineReport", "ExportSummary", "summarize_export"]


def _sum(rows: list[list[int]], steps: int) -> list[int]:
    return [sum(r[s] for r in rows) for s in range(steps)]


@dataclass
class ExportSummary:
    """One export's engine run against ours."""

    export: str
    agrees: bool
    """Every prompt: same rounds, engine − overcount = offline per position (and round by round where the
    engine counts per round), greedy outputs identical."""
    prompts_agreeing: int
    engine_rounds: int
    offline_rounds: int
    live_rounds: int | None
    engine_per_pos: list[int]
    overcount_per_pos: list[int]
    engine_reconciled: list[int]
    offline_per_pos: list[int]
    live_per_pos: list[int] | None
    tokens: int
    """Engine output tokens with speculation (prefill tokens included)."""
    verify_tokens: int
    """Of those, tokens emitted by verify rounds (all but each prompt's first)."""
    acceptance_length: float
    """Ours: verify_tokens / engine rounds."""
    offline_acceptance_length: float
    vllm_mean_acceptance_length: float
    """vLLM's own figure: 1 + accepted (overcount included) / drafts."""
    identical: dict[str, int]
    """How many prompts are identical, per comparison."""
    speed: dict[str, float]
    prompts: list[dict[str, Any]] = field(default_factory=list)
    lossless: bool = True
    """Speculative output = the engine's plain output on every prompt."""
    prompts_comparable: int = 0
    """Prompts whose outputs are identical everywhere (engine with and without speculation, store, live)."""
    comparable_agreeing: int = 0
    """Of those, prompts whose counters agree with ours exactly."""
    counters_consistent: int = 0
    """Prompts whose engine counters add up to the engine's output length (compare.counters_consistent)."""
    sglang_accept_length: float | None = None
    """SGLang's own figure: completion tokens / verify rounds, over all prompts (SGLang only)."""
    batched: dict[str, Any] | None = None
    """The batched pass, where the engine counts per request (SGLang): the same summary, without speed."""
    per_round_prompts: int = 0
    """Prompts whose engine counts came per verify round (vLLM), so compared round by round."""
    per_round_agreeing: int = 0
    """Of those, prompts whose every round accepted what ours did (the overcount in the last)."""


def summarize_export(export: str, rows: list[PromptComparison], speed: dict, *, engine: str = "vllm",
                     batched_rows: list[PromptComparison] | None = None) -> ExportSummary:
    """One export's rows summed; ``batched_rows`` (per-request counters of the batched pass) likewise."""
    steps = rows[0].steps if rows else 0
    engine_rounds = sum(r.engine_rounds for r in rows)
    offline_rounds = sum(r.offline_rounds for r in rows)
    has_live = bool(rows) and all(r.live_per_pos is not None for r in rows)
    verify_tokens = sum(max(r.tokens - 1, 0) for r in rows)
    engine_pos = _sum([r.engine_per_pos for r in rows], steps)
    offline_pos = _sum([r.offline_per_pos for r in rows], steps)
    identical: dict[str, int] = {}
    for r in rows:
        for k, v in r.identical.items():
            identical[k] = identical.get(k, 0) + int(bool(v))
    agreeing = sum(1 for r in rows if r.agrees and all(r.identical.values()))
    comparable = [r for r in rows if all(r.identical.values())]
    batched = None
    if batched_rows is not None:
        b = summarize_export(export, batched_rows, {}, engine=engine)
        batched = {k: getattr(b, k) for k in ("agrees", "lossless", "prompts_agreeing", "prompts_comparable",
                                              "comparable_agreeing", "counters_consistent", "engine_rounds",
                                              "offline_rounds", "engine_per_pos", "engine_reconciled",
                                              "offline_per_pos", "identical")}
    return ExportSummary(
        export=export, agrees=bool(rows) and agreeing == len(rows), prompts_agreeing=agreeing,
        engine_rounds=engine_rounds, offline_rounds=offline_rounds,
        live_rounds=sum(r.live_rounds for r in rows) if has_live else None,
        engine_per_pos=engine_pos, overcount_per_pos=_sum([r.overcount_per_pos for r in rows], steps),
        engine_reconciled=_sum([r.engine_reconciled for r in rows], steps), offline_per_pos=offline_pos,
        live_per_pos=_sum([r.live_per_pos for r in rows], steps) if has_live else None,
        tokens=sum(r.tokens for r in rows), verify_tokens=verify_tokens,
        acceptance_length=verify_tokens / engine_rounds if engine_rounds else 0.0,
        offline_acceptance_length=_offline_al(rows),
        vllm_mean_acceptance_length=1 + sum(engine_pos) / engine_rounds if engine_rounds else 0.0,
        identical=identical, speed=speed, prompts=[r.to_dict() for r in rows],
        lossless=bool(rows) and all(r.identical.get("spec_vs_plain", False) for r in rows),
        prompts_comparable=len(comparable), comparable_agreeing=sum(1 for r in comparable if r.agrees),
        counters_consistent=sum(1 for r in rows if r.counters_consistent),
        sglang_accept_length=(sum(r.tokens for r in rows) / engine_rounds if engine_rounds else 0.0)
        if engine == "sglang" else None, batched=batched,
        per_round_prompts=sum(1 for r in rows if r.engine_per_round is not None),
        per_round_agreeing=sum(1 for r in rows if r.engine_per_round is not None and r.first_round_differing is None
                               and r.agrees))


def _offline_al(rows: list[PromptComparison]) -> float:
    """Ours offline: tokens emitted by verify rounds / rounds."""
    rounds = sum(r.offline_rounds for r in rows)
    return sum(r.offline_emitted for r in rows) / rounds if rounds else 0.0


@dataclass
class EngineReport:
    """Everything ``osprey eval engine`` measured (``to_dict`` is report.json)."""

    engine: str
    engine_version: str
    torch_version: str
    target: str
    drafter: str
    arch: str
    steps: int
    dtype: str
    threads: int
    max_new_tokens: int
    num_prompts: int
    plain: dict[str, float]
    """The engine without speculation: load_s, tokens, seconds, tokens_per_s, batched_tokens_per_s."""
    exports: list[ExportSummary]
    engine_wall_s: float = 0.0

    @property
    def agrees(self) -> bool:
        return bool(self.exports) and all(e.agrees for e in self.exports)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["agrees"] = self.agrees
        return doc

    def to_markdown(self) -> str:
        lines = [f"# {self.engine} {self.engine_version} vs Osprey: {self.arch} drafter, S={self.steps}, {self.dtype}",
                 "",
                 f"Target {self.target}; drafter {self.drafter}; {self.num_prompts} prompts, greedy, at most "
                 f"{self.max_new_tokens} new tokens; {self.threads} CPU thread(s); torch {self.torch_version} in the "
                 f"engine; engine process {self.engine_wall_s:.0f} s.", ""]
        for e in self.exports:
            lines += self._export_md(e)
        return "\n".join(printable(line) for line in lines) + "\n"

    def _export_md(self, e: ExportSummary) -> list[str]:
        n = self.num_prompts
        if not e.lossless:
            verdict = (f"**not lossless** (speculative output = plain output on {e.identical.get('spec_vs_plain', 0)}/"
                       f"{n} prompts)")
        else:
            verdict = "**agrees**" if e.agrees else f"**disagrees** ({e.prompts_agreeing}/{n} prompts agree)"
        lines = [f"## Export {e.export}: {verdict}", ""]
        if not e.lossless:
            lines += [f"The engine's speculative decoding changed the greedy output: it verified a continuation that "
                      f"is not the target's, so its acceptance counts below check nothing (not a figure of this "
                      f"drafter). The counters were still read: those of {e.counters_consistent}/{n} prompts add "
                      f"up to the engine's output lengths.", ""]
        lines += [f"Comparable prompts (outputs identical everywhere): {e.prompts_comparable}/{n}; of those, "
                  f"{e.comparable_agreeing} agree with ours exactly per position. Engine counters consistent with "
                  f"its output lengths: {e.counters_consistent}/{n}.", ""]
        if e.per_round_prompts:
            lines += [f"Round by round (the engine's counters read after every step, one request in flight): "
                      f"{e.per_round_agreeing}/{e.per_round_prompts} prompts accept in every round what ours "
                      f"accepts; a prompt that does not names its first differing round below.", ""]
        if self.dtype == "bfloat16":
            lines += ["bfloat16: the engine's kernels and ours round differently, and a near-tie can flip a greedy "
                      "token; from there a prompt's counters count different continuations, so only comparable "
                      "prompts are expected to agree.", ""]
        lines += [
                 "| draft position | engine accepted | end-of-request overcount | engine − overcount | offline (ours) "
                 "| live (ours) |", "|---:|---:|---:|---:|---:|---:|"]
        for s in range(self.steps):
            live = "–" if e.live_per_pos is None else str(e.live_per_pos[s])
            lines.append(f"| {s + 1} | {e.engine_per_pos[s]} | {e.overcount_per_pos[s]} | {e.engine_reconciled[s]} | "
                         f"{e.offline_per_pos[s]} | {live} |")
        live_rounds = "–" if e.live_rounds is None else str(e.live_rounds)
        lines.append(f"| rounds | {e.engine_rounds} | | | {e.offline_rounds} | {live_rounds} |")
        lines += ["", f"Acceptance length (tokens per verify round, ours): engine {e.acceptance_length:.4f}, offline "
                      f"{e.offline_acceptance_length:.4f}; " + self._own_al(e) + ".", ""]
        ident = ", ".join(f"{k.replace('_', ' ')} {v}/{self.num_prompts}" for k, v in sorted(e.identical.items()))
        lines += [f"Greedy outputs identical: {ident}.", ""]
        sp, pl = e.speed, self.plain
        single = sp["tokens_per_s"] / pl["tokens_per_s"] if pl["tokens_per_s"] else 0.0
        batched = sp["batched_tokens_per_s"] / pl["batched_tokens_per_s"] if pl["batched_tokens_per_s"] else 0.0
        if e.batched is not None:
            b = e.batched
            lines += [f"Batched pass (the engine's per-request counters): lossless {b['identical'].get('spec_vs_plain', 0)}"
                      f"/{n}, comparable {b['prompts_comparable']}/{n}, agreeing {b['prompts_agreeing']}/{n}; accepted "
                      f"per position engine {b['engine_per_pos']} (reconciled {b['engine_reconciled']}) vs offline "
                      f"{b['offline_per_pos']}, rounds {b['engine_rounds']} vs {b['offline_rounds']}.", ""]
        lines += [f"Engine speed: single stream {pl['tokens_per_s']:.2f} -> {sp['tokens_per_s']:.2f} tok/s "
                  f"(x{single:.2f}); batched {pl['batched_tokens_per_s']:.2f} -> {sp['batched_tokens_per_s']:.2f} "
                  f"tok/s (x{batched:.2f}).", "",
                  "| prompt | domain | tokens | rounds engine/offline | accepted per position engine (overcount) | "
                  "offline | identical | note |", "|---|---|---:|---:|---|---|---|---|"]
        for p in e.prompts:
            same = "yes" if all(p["identical"].values()) else ", ".join(k for k, v in p["identical"].items() if not v)
            lines.append(f"| {p['id']} | {p['domain']} | {p['tokens']} | {p['engine_rounds']}/{p['offline_rounds']} | "
                         f"{p['engine_per_pos']} ({p['overcount']}) | {p['offline_per_pos']} | {same} | "
                         f"{p['why'] or ''} |")
        return lines + [""]

    def _own_al(self, e: ExportSummary) -> str:
        if e.sglang_accept_length is not None:
            return (f"SGLang's own spec_accept_length (completion tokens / verify rounds, the prefill's token "
                    f"included): {e.sglang_accept_length:.4f}")
        return f"vLLM's own mean acceptance length (overcount included): {e.vllm_mean_acceptance_length:.4f}"

    def write(self, out: Path) -> tuple[Path, Path]:
        md = write_text(Path(out) / "report.md", self.to_markdown())
        js = write_json(Path(out) / "report.json", self.to_dict())
        return md, js

"""``osprey eval live``: real speculative decoding of prompts with a target and a drafter.

For every prompt the target answers twice in the same run: once alone (plain KV-cached decoding,
the baseline) and once with the drafter (chain speculative decoding, :mod:`spec_decode`). The
report gives the acceptance length (tokens per verify step = accepted drafts + 1, SGLang's
convention, pooled over verify steps) overall and per domain, the per-position acceptance rates,
tokens/s of both and their ratio, and — for greedy decoding — how many outputs were identical
to plain decoding (they must all be: greedy verification is lossless).

Prompts are read and rendered with :mod:`osprey_data.conversation`, as the builder does, so a
store built from the same file with ``osprey data build`` holds exactly the same prompt ids
(that is what the offline/live agreement test relies on). The prompt is the conversation up to
its last user turn; ``limit`` keeps at most that many prompts, taken round-robin across domains
so that every domain stays represented.

Legend: S draft steps.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from osprey_data.atomic import write_json
from osprey_data.conversation import ChatRenderer, iter_inputs, stop_token_ids
from osprey_data.errors import ConfigError, InputError
from osprey_data.target import check_compatible, identify_target, load_hf_target, resolve_device
from osprey_train.evaluation.live_drafter import DrafterSession
from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate, speculative_generate
from osprey_train.models import load_drafter

__all__ = ["LiveConfig", "LiveReport", "LivePrompt", "run", "load_prompts", "busy_machine_threads"]


@dataclass(kw_only=True)
class LiveConfig:
    """Options of one live speculative-decoding run."""

    drafter: str
    """Drafter folder (``save_drafter`` output: Osprey or EAGLE-3)."""
    target: str
    """Target: local HF folder, hub id (online only) or a ``.gguf`` file path."""
    inputs: tuple[str, ...]
    """Prompt files (JSONL/JSON/Parquet/datasets folder, builder input formats)."""
    gguf_file: str | None = None
    """GGUF file name inside ``target`` when the target is a folder holding a GGUF."""
    steps: int = 5
    """Draft steps S per verify step (chain drafting)."""
    temperature: float = 0.0
    """0 = greedy (lossless, exact); > 0 = sampling with rejection-sampling verification."""
    max_new_tokens: int = 64
    """Generated tokens per prompt at most (EOS stops earlier)."""
    limit: int | None = None
    """At most this many prompts, round-robin across domains (None = all)."""
    device: str = "auto"
    """'cpu', 'cuda', 'cuda:N' or 'auto'."""
    seed: int = 0
    """Seed of the sampling generator (temperature > 0)."""
    baseline: bool = True
    """Also decode every prompt with the target alone (tokens/s baseline, lossless check)."""
    tap_codec: str | None = None
    """Round live taps through a store hidden codec ('bf16'/'fp8') as training saw them; None = fp32."""
    allow_target_mismatch: bool = False
    """Run even if the drafter was built for a target with another config/tokenizer hash."""
    out: str | None = None
    """Optional JSON file to write the full report to."""
    threads: int | None = None
    """torch CPU threads; None = torch's default, or 1 when the machine is already busy."""
    progress: bool = True
    """Show a tqdm progress bar."""

    def __post_init__(self) -> None:
        if isinstance(self.inputs, str):
            self.inputs = (self.inputs,)
        self.inputs = tuple(str(p) for p in self.inputs)
        if not self.inputs:
            raise ConfigError("live: give at least one --input prompt file")
        if self.steps < 1:
            raise ConfigError(f"live: --steps must be >= 1, got {self.steps}")
        if self.temperature < 0:
            raise ConfigError(f"live: --temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"live: --max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"live: --limit must be >= 1, got {self.limit}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"live: --threads must be >= 1, got {self.threads}")
        if self.tap_codec is not None and self.tap_codec not in ("bf16", "fp8"):
            raise ConfigError(f"live: --tap-codec must be 'bf16' or 'fp8', got {self.tap_codec!r}")
        if not Path(self.drafter).is_dir():
            raise ConfigError(f"live: drafter folder {self.drafter!r} does not exist")


@dataclass
class LivePrompt:
    """One prompt ready for decoding."""

    sample_id: str
    domain: str
    prompt_ids: list[int]


@dataclass
class LiveReport:
    """Figures of one live run (``to_dict`` is what ``--json`` prints)."""

    num_prompts: int
    steps: int
    temperature: float
    acceptance_length: float
    """Generated tokens / verify steps over all prompts."""
    per_domain: dict[str, dict[str, float]]
    """domain -> acceptance_length, prompts, tokens, verify_steps (and tokens/s of both)."""
    per_position: list[float]
    """k -> P(draft k accepted | drafts before it accepted), the offline report's definition."""
    spec_tokens: int
    spec_seconds: float
    plain_tokens: int | None
    plain_seconds: float | None
    greedy_identical: int | None
    """Prompts whose speculative output equals plain greedy output (greedy runs with baseline)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """Per prompt: id, domain, tokens, verify_steps, accept_lengths, identical."""
    target: str = ""
    drafter: str = ""

    @property
    def spec_tokens_per_s(self) -> float:
        return self.spec_tokens / self.spec_seconds if self.spec_seconds else 0.0

    @property
    def plain_tokens_per_s(self) -> float | None:
        if self.plain_tokens is None or not self.plain_seconds:
            return None
        return self.plain_tokens / self.plain_seconds

    @property
    def speedup(self) -> float | None:
        plain = self.plain_tokens_per_s
        return self.spec_tokens_per_s / plain if plain else None

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.update(spec_tokens_per_s=self.spec_tokens_per_s, plain_tokens_per_s=self.plain_tokens_per_s,
                   speedup=self.speedup)
        return doc

    def to_markdown(self) -> str:
        lines = [
            f"Live speculative decoding: {self.num_prompts} prompts, S={self.steps}, "
            f"temperature={self.temperature:g}",
            "",
            "| domain | prompts | tokens | verify steps | acceptance length |",
            "|---|---:|---:|---:|---:|",
        ]
        for domain, row in sorted(self.per_domain.items()):
            lines.append(f"| {domain} | {row['prompts']:.0f} | {row['tokens']:.0f} | {row['verify_steps']:.0f} | "
                         f"{row['acceptance_length']:.3f} |")
        lines.append(f"| **all** | {self.num_prompts} | {self.spec_tokens} | "
                     f"{sum(len(s['accept_lengths']) for s in self.samples)} | **{self.acceptance_length:.3f}** |")
        lines.append("")
        lines.append("Per-position acceptance: " + ", ".join(f"{k + 1}: {r:.3f}" for k, r in enumerate(self.per_position)))
        speed = f"speculative {self.spec_tokens_per_s:.1f} tok/s"
        if self.plain_tokens_per_s is not None:
            speed += f", target alone {self.plain_tokens_per_s:.1f} tok/s, speedup x{self.speedup:.2f}"
        lines.append(speed)
        if self.greedy_identical is not None:
            lines.append(f"Greedy outputs identical to plain decoding: {self.greedy_identical}/{self.num_prompts}")
        return "\n".join(lines) + "\n"


def load_prompts(inputs: tuple[str, ...] | list[str], tokenizer: Any, *, limit: int | None = None) -> list[LivePrompt]:
    """Read prompt files and render each conversation up to its last user turn."""
    renderer = ChatRenderer(tokenizer, stop_ids=frozenset({-1}))  # stop ids unused for prompts
    by_domain: dict[str, list[LivePrompt]] = defaultdict(list)
    order: list[str] = []
    for sample in iter_inputs(list(inputs)):
        where = f"{sample.file}:{sample.line}"
        if sample.is_text:
            raise InputError(f"{where}: sample {sample.sample_id!r} is pre-formatted 'text'; live decoding "
                             f"needs a conversation (or 'prompt') ending in a user turn")
        users = [i for i, m in enumerate(sample.conversation) if m["role"] == "user"]
        conversation = sample.conversation[: users[-1] + 1]
        try:
            ids = renderer.generation_prompt_ids(conversation)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        if len(ids) < 2:
            raise InputError(f"{where}: prompt renders to {len(ids)} token(s); need at least 2")
        if sample.domain not in by_domain:
            order.append(sample.domain)
        by_domain[sample.domain].append(LivePrompt(sample.sample_id, sample.domain, ids))
    prompts: list[LivePrompt] = []
    cursor = 0
    total = sum(len(v) for v in by_domain.values())
    if total == 0:
        raise InputError(f"no prompts in {list(inputs)}")
    want = total if limit is None else min(limit, total)
    while len(prompts) < want:  # round-robin keeps every domain represented under --limit
        for domain in order:
            if cursor < len(by_domain[domain]) and len(prompts) < want:
                prompts.append(by_domain[domain][cursor])
        cursor += 1
    return prompts


def run(config: LiveConfig) -> LiveReport:
    """Decode every prompt with the target alone and with the drafter; return the figures."""
    threads = config.threads if config.threads is not None else busy_machine_threads(
        print if config.progress else None)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(config)
    finally:
        torch.set_num_threads(before)  # a library call must not change the caller's settings


def _run(config: LiveConfig) -> LiveReport:
    device = resolve_device(config.device)
    drafter = load_drafter(config.drafter, device=device)
    model, tokenizer = load_hf_target(config.target, gguf_file=config.gguf_file, device=device)
    check_compatible(drafter.config, identify_target(model, tokenizer, config.target),
                     where=f"live: drafter {config.drafter} on target {config.target}",
                     check_identity=not config.allow_target_mismatch,
                     hint="use the drafter's own target, or pass --allow-target-mismatch")
    prompts = load_prompts(config.inputs, tokenizer, limit=config.limit)
    eos = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    taps = drafter.config.tap_layers.layer_ids
    target = HFTargetSession(model, taps)
    session = DrafterSession(drafter, target_vocab_size=model.get_output_embeddings().weight.shape[0],
                             tap_codec=config.tap_codec)
    greedy = config.temperature <= 0
    spec_gen = torch.Generator().manual_seed(config.seed)
    plain_gen = torch.Generator().manual_seed(config.seed + 1)

    def spec(p: LivePrompt, n: int):
        return speculative_generate(target, session, p.prompt_ids, num_steps=config.steps, max_new_tokens=n,
                                    temperature=config.temperature, eos_ids=eos, generator=spec_gen)

    def plain(p: LivePrompt, n: int):
        return plain_generate(target, p.prompt_ids, max_new_tokens=n, temperature=config.temperature,
                              eos_ids=eos, generator=plain_gen)

    # warm-up (first-call allocations and kernel selection would otherwise bias the first timing)
    spec(prompts[0], 2)
    if config.baseline:
        plain(prompts[0], 2)
    samples: list[dict[str, Any]] = []
    spec_results, plain_results = [], []
    for i, prompt in enumerate(tqdm(prompts, desc="live decoding", unit="prompt", disable=not config.progress)):
        # alternate the order so that slow drift of a shared machine hits both equally
        if config.baseline and i % 2:
            plain_results.append(plain(prompt, config.max_new_tokens))
        spec_results.append(spec(prompt, config.max_new_tokens))
        if config.baseline and not i % 2:
            plain_results.append(plain(prompt, config.max_new_tokens))
        res = spec_results[-1]
        identical = (res.output_ids == plain_results[-1].output_ids) if (config.baseline and greedy) else None
        samples.append({"id": prompt.sample_id, "domain": prompt.domain, "tokens": len(res.output_ids),
                        "verify_steps": len(res.accept_lengths), "accept_lengths": res.accept_lengths,
                        "drafted": res.drafted, "accepted": res.accepted,
                        "seconds": res.seconds, "plain_seconds": plain_results[-1].seconds if config.baseline else None,
                        "plain_tokens": len(plain_results[-1].output_ids) if config.baseline else None,
                        "identical": identical, "finish_reason": res.finish_reason})
    report = summarize(samples, steps=config.steps, temperature=config.temperature, baseline=config.baseline)
    report.target, report.drafter = config.target, config.drafter
    if config.out:
        write_json(Path(config.out), report.to_dict())
    return report


def busy_machine_threads(note=None) -> int | None:
    """1 torch thread when other jobs already keep every core busy, else None (torch's default).

    On a loaded box several OpenMP threads spin-wait for each other; measured here at a load
    average of 5-8 on 2 cores, one thread decoded SmolLM2 4-6x faster than two.
    """
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 1.5 * cores:
        if note is not None:
            note(f"machine busy (load average {load:.1f} on {cores} cores): using 1 torch thread; "
                 f"pass --threads N to override")
        return 1
    return None


def summarize(samples: list[dict[str, Any]], *, steps: int, temperature: float, baseline: bool) -> LiveReport:
    """Pool per-prompt records into a :class:`LiveReport`."""
    per_domain: dict[str, dict[str, float]] = {}
    for domain in sorted({s["domain"] for s in samples}):
        rows = [s for s in samples if s["domain"] == domain]
        tokens = sum(s["tokens"] for s in rows)
        verify = sum(s["verify_steps"] for s in rows)
        per_domain[domain] = {"prompts": len(rows), "tokens": tokens, "verify_steps": verify,
                              "acceptance_length": tokens / verify if verify else 0.0}
    tokens = sum(s["tokens"] for s in samples)
    verify = sum(s["verify_steps"] for s in samples)
    # conditional rate of draft position k, as offline: judged when drafts 0..k-1 were accepted
    reached, hits = [0] * steps, [0] * steps
    for s in samples:
        for a, drafted in zip(s.get("accepted", []), s.get("drafted", [])):
            for k in range(min(a + 1, drafted, steps)):
                reached[k] += 1
                hits[k] += int(k < a)
    per_position = [hits[k] / reached[k] if reached[k] else 0.0 for k in range(steps)]
    spec_seconds = sum(s["seconds"] for s in samples)
    plain_seconds = sum(s["plain_seconds"] for s in samples) if baseline else None
    identical = None
    if baseline and temperature <= 0:
        identical = sum(bool(s["identical"]) for s in samples)
    return LiveReport(num_prompts=len(samples), steps=steps, temperature=temperature,
                      acceptance_length=tokens / verify if verify else 0.0, per_domain=per_domain,
                      per_position=per_position, spec_tokens=tokens, spec_seconds=spec_seconds,
                      plain_tokens=sum(s["plain_tokens"] for s in samples) if baseline else None,
                      plain_seconds=plain_seconds, greedy_identical=identical, samples=samples)

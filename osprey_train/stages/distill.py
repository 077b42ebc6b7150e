"""Stage 4 (distill): EAGLE-3 Training-Time-Test distillation of a drafter from a feature store.

``run(DistillConfig)`` trains the drafter in ``--drafter`` (Osprey or EAGLE-3: the architecture
comes from the drafter folder's config.json, so the two are trained with identical data, steps,
loss and schedule) on packed samples of ``--store`` through the shared trainer
(:func:`osprey_train.trainer.loop.train`: AdamW, cosine schedule, DDP/FSDP under torchrun,
checkpoints, exact resume, metrics.jsonl + plots), configured by ``DistillConfig.loop`` and
``.optim``. The loss is ``sum_k decay^k CE_k`` over ``ttt_steps`` TTT
steps (:mod:`osprey_train.ttt.unroll`); metrics carry loss and accuracy per TTT step; with
``--eval-store`` the offline acceptance length is evaluated periodically.

The trained module is :class:`DistillModel` (the drafter plus the TTT forward), so DDP sees one
``forward`` per micro-batch; the final folder holds the plain drafter (``save_drafter``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from osprey_data.cpu_threads import note_to_stderr, torch_threads
from osprey_data.errors import ConfigError, ModelError
from osprey_data.store import StoreReader
from osprey_data.target_model import check_compatible, peek_model_config
from osprey_train.distill_data.packing import StorePacker
from osprey_train.drafters.registry import drafter_spec
from osprey_train.distill_data.prefetch import BatchPrefetcher
from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.models import load_drafter, save_drafter
from osprey_train.models.io import read_drafter_config
from osprey_train.stages.configs import DistillConfig
from osprey_train.trainer import config_json
from osprey_train.trainer.loop import TrainResult, check_resume_request, train
from osprey_train.trainer.resume_check import check_resume_config
from osprey_train.trainer.run_lock import run_lock
from osprey_train.ttt.attention import resolve_impl
from osprey_train.ttt.loss import VocabMap
from osprey_train.ttt.target_head import load_target_head
from osprey_train.ttt.unroll import ttt_loss

__all__ = ["DistillConfig", "DistillModel", "DistillTask", "run"]

class DistillModel(nn.Module):
    """The drafter plus its TTT forward: ``forward(batch) -> (loss, metrics)``."""

    def __init__(self, drafter: nn.Module, *, steps: int, decay: float, target_dist: str,
                 impl: str, chunk_size: int, target_head: nn.Module | None,
                 score_out_of_vocab: bool = False) -> None:
        super().__init__()
        self.drafter = drafter
        self.steps, self.decay, self.target_dist = steps, decay, target_dist
        self.impl, self.chunk_size = impl, chunk_size
        self.score_out_of_vocab = score_out_of_vocab
        self.checkpoint_steps = False
        # Not a submodule: the frozen target head is neither trained, checkpointed nor saved.
        self._target_head = [target_head]
        self._vmap = VocabMap.from_drafter(drafter.draft_to_target, drafter.config.vocab_size)

    @classmethod
    def from_config(cls, drafter: nn.Module, cfg: "DistillConfig", target_head: nn.Module | None) -> "DistillModel":
        """The chain architectures' objective hook (``DrafterSpec.objective``): TTT with ``cfg``'s settings."""
        return cls(drafter, steps=cfg.ttt_steps, decay=cfg.ttt_decay, target_dist=cfg.target_dist,
                   impl=cfg.attention, chunk_size=cfg.loss_chunk, target_head=target_head,
                   score_out_of_vocab=cfg.score_out_of_vocab)

    def forward(self, batch) -> tuple[torch.Tensor, dict[str, float]]:
        device = batch.input_ids_BT.device
        head = self._target_head[0]
        if head is not None and head.weight_VtDt.device != device:
            head = self._target_head[0] = head.to(device)
        d2t = self.drafter.draft_to_target
        if d2t is not None and self._vmap.draft_to_target_V.device != device:
            self._vmap = VocabMap.from_drafter(d2t.to(device), self.drafter.config.vocab_size)
        out = ttt_loss(self.drafter, batch, steps=self.steps, decay=self.decay,
                       target_dist=self.target_dist, impl=resolve_impl(self.impl, device),
                       chunk_size=self.chunk_size, target_head=head, vmap=self._vmap,
                       checkpoint_steps=self.checkpoint_steps, score_out_of_vocab=self.score_out_of_vocab)
        return out.loss, out.metrics


class DistillTask:
    """The :class:`osprey_train.trainer.loop.TrainTask` of Stage 4."""

    def __init__(self, cfg: DistillConfig) -> None:
        if not (cfg.drafter / "config.json").is_file():
            raise ConfigError(f"distill: {cfg.drafter} is not a drafter folder (no config.json); "
                              "create one with `osprey train convert`")
        self.cfg = cfg
        self.reader = StoreReader(cfg.store)
        self.drafter_config = read_drafter_config(cfg.drafter)
        check_compatible(self.drafter_config, self.reader.header.target, taps=self.reader.header.taps,
                         where=f"distill --store {cfg.store}")
        if cfg.target_dist == "full" and not self.reader.header.has_final_hidden:
            raise ConfigError(f"distill: --target-dist full needs a store built with final_hidden; "
                              f"{cfg.store} has none (use tail or renorm, or rebuild with final hidden)")
        if cfg.teacher_topk > self.reader.header.topk:
            raise ConfigError(f"distill: --teacher-topk {cfg.teacher_topk} exceeds the top-{self.reader.header.topk} "
                              f"that {cfg.store} stores; use at most {self.reader.header.topk} (or 0: all of it)")
        self.packer = StorePacker(self.reader, cfg.tokens_per_batch, seed=cfg.loop.seed,
                                  need_final_hidden=cfg.target_dist == "full", teacher_topk=cfg.teacher_topk)
        self.prefetcher = None
        self.target_head = None
        if cfg.target_dist == "full":
            path = cfg.target_model or self.reader.header.target.name_or_path
            shape = peek_model_config(path, option="--target-model")
            if shape is not None and None not in (shape.vocab_size, shape.hidden_size):   # before the head loads
                self._check_target_head(shape.vocab_size, shape.hidden_size, where=shape.path)
            self.target_head = load_target_head(path)
            self._check_target_head(self.target_head.vocab_size, self.target_head.hidden_size, where=path)
        self.eval_reader = None
        if cfg.eval_store:
            self.eval_reader = StoreReader(cfg.eval_store)
            check_compatible(self.drafter_config, self.eval_reader.header.target, taps=self.eval_reader.header.taps,
                             where=f"distill --eval-store {cfg.eval_store}")

    def _check_target_head(self, vocab: int, hidden: int, *, where: str) -> None:
        target = self.reader.header.target
        if (vocab, hidden) != (target.vocab_size, target.hidden_size):
            raise ModelError(f"distill --target-model: {where}: LM head is ({vocab}, {hidden}), the store's "
                             f"target has vocab {target.vocab_size} and hidden {target.hidden_size}; pass the "
                             "right --target-model")

    # -- TrainTask --
    def build_model(self) -> nn.Module:
        drafter = load_drafter(self.cfg.drafter)
        if self.cfg.freeze_embeddings:
            for name, p in drafter.named_parameters():
                if "embed_tokens" in name:
                    p.requires_grad_(False)
        # the architecture's training objective (TTT for the chain drafters)
        return drafter_spec(drafter.config.arch).load("objective")(drafter, self.cfg, self.target_head)

    def trainable_parameters(self, model: nn.Module):
        return [p for p in model.parameters() if p.requires_grad]

    def enable_gradient_checkpointing(self, model: nn.Module) -> None:
        model.checkpoint_steps = True

    def batch(self, step: int, micro: int, rank: int, world_size: int):
        index = (step * self.cfg.loop.grad_accum + micro) * world_size + rank
        if self.cfg.prefetch == 0:
            return self.packer.batch(index)
        if self.prefetcher is None:
            # this rank asks for index, index + world_size, ...; the run ends before `stop`
            self.prefetcher = BatchPrefetcher(self.packer.batch, depth=self.cfg.prefetch, stride=world_size,
                                              stop=self.cfg.loop.max_steps * self.cfg.loop.grad_accum * world_size)
        return self.prefetcher.get(index)

    def loss(self, model: nn.Module, batch) -> tuple[torch.Tensor, dict[str, float]]:
        return model(batch)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        if self.eval_reader is None:
            return {}
        drafter = model.drafter
        impl = "sdpa" if self.cfg.attention in ("auto", "flex") else self.cfg.attention
        report = evaluate_acceptance(drafter, self.eval_reader, steps=self.cfg.eval_draft_steps,
                                     max_samples=self.cfg.eval_samples or None, impl=impl, progress=False)
        out = {"accept_len": report.overall}
        out.update({f"accept_len/{d}": v for d, v in report.per_domain.items()})
        out.update({f"accept_rate_pos{s}": r for s, r in enumerate(report.per_position)})
        return out

    def save_model(self, model: nn.Module, out_dir: Path) -> None:
        save_drafter(model.drafter, out_dir)


def run(cfg: DistillConfig) -> TrainResult:
    """Distill; returns the trainer's ``TrainResult`` (final drafter in ``loop.out_dir/final``).

    The run folder's lock is taken and a resume checked against the checkpoint's recorded options
    before the drafter or the store is opened."""
    with run_lock(cfg.loop.out_dir), torch_threads(cfg.threads, note_to_stderr if cfg.loop.progress else None):
        check_resume_request(cfg.loop)
        check_resume_config(cfg)
        task = DistillTask(cfg)
        loop = dataclasses.replace(cfg.loop, extra={"stage": "distill", "config": config_json(cfg)})
        return train(task, loop, cfg.optim)

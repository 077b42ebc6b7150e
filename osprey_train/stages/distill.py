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
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from osprey_data.errors import ConfigError, ModelError
from osprey_data.store import StoreReader
from osprey_data.target_model import check_compatible
from osprey_train.distill_data.packing import StorePacker
from osprey_train.distill_data.prefetch import BatchPrefetcher
from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.models import load_drafter, save_drafter
from osprey_train.models.io import read_drafter_config
from osprey_train.stages.defaults import distill_optim
from osprey_train.trainer import LoopConfig, OptimConfig, config_json
from osprey_train.trainer.loop import TrainResult, train
from osprey_train.ttt.attention import resolve_impl
from osprey_train.ttt.loss import VocabMap
from osprey_train.ttt.target_head import load_target_head
from osprey_train.ttt.unroll import ttt_loss

__all__ = ["DistillConfig", "DistillModel", "DistillTask", "run"]

_ATTN = ("auto", "flex", "sdpa", "eager")


@dataclass(kw_only=True)
class DistillConfig:
    """Options of ``osprey train distill``."""

    drafter: Path
    """Drafter folder (config.json + model.safetensors) from ``osprey train convert``."""
    store: str
    """Training feature store (path or fsspec URL)."""
    loop: LoopConfig
    """The trainer's loop: run folder (``out_dir``: checkpoints/, metrics, final/ = the distilled
    drafter), steps, gradient accumulation, logging, eval and save periods, seed, devices."""
    optim: OptimConfig = field(default_factory=distill_optim)
    """AdamW and schedule; defaults as pretraining except no weight decay (see ``stages/defaults.py``)."""
    eval_store: str | None = None
    """Held-out store for periodic offline acceptance (greedy chain decoding simulation)."""
    ttt_steps: int = 5
    """TTT unroll length K (1 = plain next-token distillation)."""
    ttt_decay: float = 0.8
    """Weight decay^k of step k's CE in the loss."""
    target_dist: str = "tail"
    """Target distribution: tail (top-k + tail bucket), renorm (top-k only) or full (final_hidden)."""
    target_model: str | None = None
    """Target HF folder for --target-dist full (default: the store's target name_or_path)."""
    score_out_of_vocab: bool = False
    """Drafters with a draft vocabulary (EAGLE-3, Osprey converted with ``--draft-vocab``): also
    score positions whose target top-1 is outside it (never acceptable; left out by default, as
    SpecForge does). No effect on full-vocabulary drafters."""
    tokens_per_batch: int = 4096
    """Budget of one packed micro-batch in slots (one row of whole samples, no padding; a sample of n tokens
    fills n - 1 slots, see osprey_train.ttt.layout)."""
    prefetch: int = 2
    """Micro-batches read and packed ahead of training on a background thread (0 = off): the
    step never waits on the store. Batches are identical either way; memory: this many batches."""
    attention: str = "auto"
    """TTT attention: auto (flex on CUDA, else sdpa), flex, sdpa or eager."""
    freeze_embeddings: bool = True
    """Keep the input embedding frozen (EAGLE-3 practice; saves its AdamW state)."""
    loss_chunk: int = 1024
    """Rows per LM-head/loss chunk (bounds the [rows, vocab] logits held at once)."""
    eval_samples: int = 64
    """Eval-store samples used per evaluation (0 = all)."""
    eval_draft_steps: int = 5
    """Draft length S of the acceptance evaluation."""

    def __post_init__(self) -> None:
        self.drafter = Path(self.drafter)
        checks = [
            (isinstance(self.ttt_steps, int) and 1 <= self.ttt_steps <= 64, f"--ttt-steps must be in [1, 64], got {self.ttt_steps!r}"),
            (0.0 < self.ttt_decay <= 1.0, f"--ttt-decay must be in (0, 1], got {self.ttt_decay!r}"),
            (self.target_dist in ("tail", "renorm", "full"), f"--target-dist must be tail, renorm or full, got {self.target_dist!r}"),
            (self.tokens_per_batch >= 2, f"--tokens-per-batch must be >= 2, got {self.tokens_per_batch}"),
            (isinstance(self.prefetch, int) and self.prefetch >= 0, f"--prefetch must be >= 0, got {self.prefetch!r}"),
            (self.attention in _ATTN, f"--attention must be one of {_ATTN}, got {self.attention!r}"),
            (self.loss_chunk >= 1, f"loss_chunk must be >= 1, got {self.loss_chunk}"),
            (self.eval_samples >= 0 and self.eval_draft_steps >= 1, "eval_samples >= 0 and eval_draft_steps >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"distill: {msg}")
        if not (self.drafter / "config.json").is_file():
            raise ConfigError(f"distill: {self.drafter} is not a drafter folder (no config.json); "
                              "create one with `osprey train convert`")


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
        self.cfg = cfg
        self.reader = StoreReader(cfg.store)
        self.drafter_config = read_drafter_config(cfg.drafter)
        check_compatible(self.drafter_config, self.reader.header.target, taps=self.reader.header.taps,
                         where=f"distill --store {cfg.store}")
        if cfg.target_dist == "full" and not self.reader.header.has_final_hidden:
            raise ConfigError(f"distill: --target-dist full needs a store built with final_hidden; "
                              f"{cfg.store} has none (use tail or renorm, or rebuild with final hidden)")
        self.packer = StorePacker(self.reader, cfg.tokens_per_batch, seed=cfg.loop.seed,
                                  need_final_hidden=cfg.target_dist == "full")
        self.prefetcher = None
        self.target_head = None
        if cfg.target_dist == "full":
            path = cfg.target_model or self.reader.header.target.name_or_path
            self.target_head = load_target_head(path)
            if (self.target_head.vocab_size, self.target_head.hidden_size) != (
                    self.reader.header.target.vocab_size, self.reader.header.target.hidden_size):
                raise ModelError(f"{path}: LM head is {tuple(self.target_head.weight_VtDt.shape)}, the store's "
                                 f"target has vocab {self.reader.header.target.vocab_size} and hidden "
                                 f"{self.reader.header.target.hidden_size}; pass the right --target-model")
        self.eval_reader = None
        if cfg.eval_store:
            self.eval_reader = StoreReader(cfg.eval_store)
            check_compatible(self.drafter_config, self.eval_reader.header.target, taps=self.eval_reader.header.taps,
                             where=f"distill --eval-store {cfg.eval_store}")

    # -- TrainTask --
    def build_model(self) -> nn.Module:
        drafter = load_drafter(self.cfg.drafter)
        if self.cfg.freeze_embeddings:
            for name, p in drafter.named_parameters():
                if "embed_tokens" in name:
                    p.requires_grad_(False)
        return DistillModel(drafter, steps=self.cfg.ttt_steps, decay=self.cfg.ttt_decay,
                            target_dist=self.cfg.target_dist, impl=self.cfg.attention,
                            chunk_size=self.cfg.loss_chunk, target_head=self.target_head,
                            score_out_of_vocab=self.cfg.score_out_of_vocab)

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
    """Distill; returns the trainer's ``TrainResult`` (final drafter in ``loop.out_dir/final``)."""
    task = DistillTask(cfg)
    loop = dataclasses.replace(cfg.loop, extra={"stage": "distill", "config": config_json(cfg)})
    return train(task, loop, cfg.optim)

"""Typed configs of the generic trainer: optimizer/schedule settings and the loop settings.

Both configs are plain ``@dataclass(kw_only=True)`` objects checked in ``__post_init__`` so a
bad value fails before any model is built, with a :class:`ConfigError` naming the field. They
are shared by every stage that trains (Stage 2 pretraining, Stage 4 distillation): a stage
config holds them as its ``loop`` and ``optim`` fields, and the CLI generates their options
from these fields (``osprey_cli.config_options``), defaults and docstrings included. A stage that needs another default says so
in ``osprey_train/stages/defaults.py``.

This module is free of torch so that the CLI can show the defaults in ``--help`` cheaply.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from osprey_data.errors import ConfigError
from osprey_data.target_model.loading import check_device

__all__ = ["OptimConfig", "LoopConfig", "SCHEDULE_NAMES", "DISTRIBUTED_MODES", "TRAIN_PRECISIONS", "config_json"]

SCHEDULE_NAMES: tuple[str, ...] = ("cosine", "linear", "constant")
DISTRIBUTED_MODES: tuple[str, ...] = ("auto", "none", "ddp", "fsdp")
# = osprey_data.target_model.TRAIN_PRECISIONS (that package imports torch-using modules; a test checks)
TRAIN_PRECISIONS: tuple[str, ...] = ("auto", "float32", "bf16-autocast")


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW + learning-rate schedule settings (defaults follow the Osprey paper)."""

    lr: float = 1e-4
    """Peak learning rate, reached at the end of the linear warmup."""
    betas: tuple[float, float] = field(default=(0.9, 0.95), metadata={"cli": False})
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay on >=2-D non-embedding weights (see ``optim.param_groups``)."""
    grad_clip: float = 1.0
    """Clip the global gradient L2 norm to this value; 0 disables clipping."""
    warmup_ratio: float = 0.01
    """Fraction of ``max_steps`` spent in linear warmup from 0 to ``lr`` (at least 1 step if > 0)."""
    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of ``lr`` (cosine/linear decay end point)."""
    schedule: str = field(default="cosine", metadata={"choices": SCHEDULE_NAMES})
    """Decay after warmup: one of ``cosine``, ``linear``, ``constant``."""

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        _check(math.isfinite(self.lr) and self.lr > 0, f"OptimConfig.lr must be > 0, got {self.lr}")
        _check(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas),
               f"OptimConfig.betas must be two numbers in [0, 1), got {self.betas}")
        _check(self.eps > 0, f"OptimConfig.eps must be > 0, got {self.eps}")
        _check(self.weight_decay >= 0, f"OptimConfig.weight_decay must be >= 0, got {self.weight_decay}")
        _check(self.grad_clip >= 0, f"OptimConfig.grad_clip must be >= 0 (0 = off), got {self.grad_clip}")
        _check(0.0 <= self.warmup_ratio < 1.0,
               f"OptimConfig.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        _check(0.0 <= self.min_lr_ratio <= 1.0,
               f"OptimConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.schedule in SCHEDULE_NAMES,
               f"OptimConfig.schedule must be one of {SCHEDULE_NAMES}, got {self.schedule!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (used in the trainer state to refuse mismatching resumes)."""
        out = asdict(self)
        out["betas"] = list(self.betas)
        return out


@dataclass(kw_only=True)
class LoopConfig:
    """Settings of the training loop: length, batching, logging, checkpoints, devices."""

    out_dir: Path = field(metadata={"option": "out"})
    """Run folder: ``checkpoints/``, ``metrics.jsonl``, ``metrics.png`` and ``final/`` go here."""
    max_steps: int = field(default=1000, metadata={"option": "steps"})
    """Number of optimizer steps (each = ``grad_accum`` micro-batches per rank)."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step."""
    seed: int = 0
    """Seed of model init (same on all ranks) and of per-rank RNGs (seed + rank)."""
    device: str = field(default="auto", metadata={"operational": True})
    """``auto`` (CUDA if available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    log_every: int = field(default=10, metadata={"operational": True})
    """Write a train record to metrics.jsonl every this many steps."""
    eval_every: int = 0
    """Run ``task.evaluate`` every this many steps (0 = only after the last step)."""
    save_every: int = field(default=0, metadata={"operational": True})
    """Write a checkpoint every this many steps (0 = only after the last step)."""
    resume: bool = field(default=False, metadata={"operational": True})
    """Continue from the newest complete checkpoint in ``out_dir/checkpoints``; a folder without
    one is an error (a mistyped ``--out`` must not silently start over)."""
    resume_if_any: bool = field(default=False, metadata={"operational": True})
    """Like ``resume``, but start from step 0 when ``out_dir`` holds no checkpoint yet (for a
    scheduler or script that reruns one command until it finishes)."""
    distributed: str = field(default="auto", metadata={"choices": DISTRIBUTED_MODES, "operational": True})
    """``auto`` (DDP when launched by torchrun with >1 process), ``none``, ``ddp`` or ``fsdp``."""
    precision: str = field(default="auto", metadata={"choices": TRAIN_PRECISIONS})
    """``float32``, or ``bf16-autocast`` (float32 weights and optimizer, bf16 matmuls in forward and
    backward); ``auto`` is bf16-autocast on CUDA and on a CPU with bf16 matrix units (AMX/AVX512-BF16),
    float32 otherwise. The resolved name is recorded in the trainer state."""
    gradient_checkpointing: bool = field(default=False, metadata={"operational": True})
    """Trade compute for memory: HF ``gradient_checkpointing_enable`` or the task's hook."""
    progress: bool = field(default=True, metadata={"operational": True})
    """Show a tqdm bar (rank 0) with loss and tokens/s."""
    eval_at_start: bool = field(default=False, metadata={"cli": False})
    """Also evaluate before the first step (records the untrained baseline as step 0)."""
    keep_checkpoints: int = field(default=2, metadata={"operational": True})
    """Keep only this many newest checkpoints (0 = keep all)."""
    plot: bool = field(default=True, metadata={"operational": True})
    """Write ``metrics.png`` (loss and perplexity curves) at every eval/save and at the end."""
    extra: dict[str, Any] = field(default_factory=dict, metadata={"cli": False})
    """Free-form run description stored in the trainer state (e.g. the stage config)."""

    @property
    def resuming(self) -> bool:
        """Whether an existing checkpoint is continued (``resume`` or ``resume_if_any``)."""
        return self.resume or self.resume_if_any

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        for name in ("max_steps", "grad_accum"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, f"LoopConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("log_every", "eval_every", "save_every", "keep_checkpoints"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 0, f"LoopConfig.{name} must be an int >= 0, got {value!r}")
        _check(self.log_every >= 1, f"LoopConfig.log_every must be >= 1, got {self.log_every}")
        _check(self.distributed in DISTRIBUTED_MODES,
               f"LoopConfig.distributed must be one of {DISTRIBUTED_MODES}, got {self.distributed!r}")
        _check(self.precision in TRAIN_PRECISIONS,
               f"LoopConfig.precision must be one of {TRAIN_PRECISIONS}, got {self.precision!r}")
        check_device(self.device)


def config_json(config: Any) -> Any:
    """A (nested) config dataclass as plain JSON values: paths become strings, tuples lists.

    Stages store it in the trainer state (``LoopConfig.extra``) to describe the run and to refuse
    a resume with different data or model settings.
    """
    if is_dataclass(config) and not isinstance(config, type):
        return config_json(asdict(config))
    if isinstance(config, dict):
        return {str(k): config_json(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [config_json(v) for v in config]
    if isinstance(config, Path):
        return str(config)
    return config

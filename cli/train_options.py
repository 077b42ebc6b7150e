"""The trainer's command-line options, declared once for ``osprey train pretrain`` and ``distill``.

Each option is named after its field in :class:`~osprey_train.trainer.LoopConfig` or
:class:`~osprey_train.trainer.OptimConfig` and takes its default from there (or from the
stage's row in ``osprey_train/stages/defaults.py``), so a default cannot drift between the
commands and the library. :func:`loop_config` and :func:`optim_config` turn the parsed values
back into the configs a stage config holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osprey_train.trainer.config import DISTRIBUTED_MODES, SCHEDULE_NAMES, TRAIN_PRECISIONS, LoopConfig, OptimConfig

__all__ = ["loop_options", "optim_options", "loop_config", "optim_config"]

F = TypeVar("F", bound=Callable[..., Any])

# field -> (option declarations, click keyword arguments); the field's default is added below.
_LOOP_OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "out_dir": (("--out",), dict(required=True, type=click.Path(path_type=Path),
                                 help="Run folder: checkpoints/, metrics.jsonl, metrics.png, final/.")),
    "max_steps": (("--steps",), dict(type=int, help="Optimizer steps.")),
    "grad_accum": (("--grad-accum",), dict(type=int, help="Micro-batches per optimizer step (per process).")),
    "log_every": (("--log-every",), dict(type=int, help="Write a metrics record every N steps.")),
    "eval_every": (("--eval-every",), dict(type=int, help="Evaluate every N steps (0 = at the end only).")),
    "save_every": (("--save-every",), dict(type=int, help="Checkpoint every N steps (0 = at the end only).")),
    "resume": (("--resume",), dict(is_flag=True, help="Continue from the newest complete checkpoint in --out.")),
    "seed": (("--seed",), dict(type=int, help="Seed of the data order, the initialisation and the RNGs.")),
    "device": (("--device",), dict(help="auto, cpu, cuda or cuda:N.")),
    "distributed": (("--distributed",), dict(type=click.Choice(DISTRIBUTED_MODES),
                                            help="auto = DDP when launched by torchrun with >1 process.")),
    "precision": (("--precision",), dict(type=click.Choice(TRAIN_PRECISIONS),
                                         help="auto = bf16-autocast on CUDA or an AMX/AVX512-BF16 CPU, else "
                                              "float32 (float32 weights either way).")),
    "gradient_checkpointing": (("--gradient-checkpointing",),
                               dict(is_flag=True, help="Recompute activations in backward to save memory.")),
    "progress": (("--progress/--no-progress",), dict(help="Show progress bars.")),
}
_OPTIM_OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "lr": (("--lr",), dict(type=float, help="Peak learning rate (after the linear warmup).")),
    "warmup_ratio": (("--warmup-ratio",), dict(type=float, help="Fraction of the steps spent in linear warmup.")),
    "schedule": (("--schedule",), dict(type=click.Choice(SCHEDULE_NAMES), help="Decay after the warmup.")),
    "min_lr_ratio": (("--min-lr-ratio",), dict(type=float, help="Final learning rate / peak learning rate.")),
    "weight_decay": (("--weight-decay",), dict(type=float, help="AdamW decoupled weight decay (matrices only).")),
    "grad_clip": (("--grad-clip",), dict(type=float, help="Clip the gradient norm to this (0 = off).")),
}


def _field_defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def _decorate(fn: F, options: dict[str, tuple[tuple[str, ...], dict[str, Any]]], defaults: dict[str, Any]) -> F:
    for name, (decls, kwargs) in reversed(options.items()):  # click lists options in decoration order
        kwargs = dict(kwargs)
        if name in defaults and not kwargs.get("required"):
            kwargs.setdefault("default", defaults[name])
            kwargs.setdefault("show_default", not kwargs.get("is_flag", False))
        fn = click.option(*decls, name, **kwargs)(fn)
    return fn


def loop_options(fn: F) -> F:
    """Add the :class:`LoopConfig` options (``--out``, ``--steps``, ...) to a click command."""
    return _decorate(fn, _LOOP_OPTIONS, _field_defaults(LoopConfig))


def optim_options(stage_defaults: dict[str, Any]) -> Callable[[F], F]:
    """Add the :class:`OptimConfig` options, with ``stage_defaults`` replacing the class defaults."""
    unknown = set(stage_defaults) - set(_OPTIM_OPTIONS)
    if unknown:  # pragma: no cover - a programming error in stages/defaults.py
        raise ValueError(f"stage optimizer defaults name no option: {sorted(unknown)}")
    defaults = {**_field_defaults(OptimConfig), **stage_defaults}
    return lambda fn: _decorate(fn, _OPTIM_OPTIONS, defaults)


def loop_config(params: dict[str, Any]) -> LoopConfig:
    """Take the loop options out of a command's parsed ``params`` (removed from it) as a LoopConfig."""
    return LoopConfig(**{name: params.pop(name) for name in _LOOP_OPTIONS})


def optim_config(params: dict[str, Any]) -> OptimConfig:
    """Take the optimizer options out of ``params`` (removed from it) as an OptimConfig."""
    return OptimConfig(**{name: params.pop(name) for name in _OPTIM_OPTIONS})

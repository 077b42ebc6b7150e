"""Generic training machinery shared by Stage 2 (pretrain) and Stage 4 (distill).

Public API (interfaces.md section 3): :class:`OptimConfig`, :class:`LoopConfig`,
:class:`TrainTask`, :func:`train`, :class:`TrainResult`. Submodules: ``config`` (the two
configs), ``optim`` (AdamW groups + schedule), ``distributed`` (DDP/FSDP), ``checkpoint``
(safetensors + JSON checkpoints), ``metrics`` (JSONL + PNG), ``loop`` (the loop itself).
"""

from __future__ import annotations

from osprey_train.trainer.config import LoopConfig, OptimConfig
from osprey_train.trainer.loop import TrainResult, TrainTask, train

__all__ = ["OptimConfig", "LoopConfig", "TrainTask", "train", "TrainResult"]

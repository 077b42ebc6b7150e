"""Generic training machinery shared by Stage 2 (pretrain) and Stage 4 (distill).

Submodules: ``config`` (:class:`OptimConfig`, :class:`LoopConfig`: what stage configs hold as
their ``loop`` and ``optim`` fields), ``loop`` (:class:`~osprey_train.trainer.loop.TrainTask`,
:func:`~osprey_train.trainer.loop.train`, :class:`~osprey_train.trainer.loop.TrainResult`),
``optim`` (AdamW groups + schedule), ``distributed`` (DDP/FSDP), ``checkpoint`` (safetensors +
JSON checkpoints), ``metrics`` (JSONL + PNG).

Only the configs are exported here: they are free of torch, so the CLI can read their defaults
for ``--help`` without importing it. Import the loop from ``osprey_train.trainer.loop``.
"""

from __future__ import annotations

from osprey_train.trainer.config import LoopConfig, OptimConfig, config_json

__all__ = ["OptimConfig", "LoopConfig", "config_json"]

"""Where a training stage departs from the shared trainer defaults, and why: the one place.

``OptimConfig``'s defaults are the Osprey paper's pretraining recipe (AdamW betas (0.9, 0.95),
weight decay 0.1, clip 1.0, peak lr 1e-4, 1 % warmup, cosine). Stage 4 keeps all of them except
weight decay: EAGLE-3's reference training (and SpecForge, which copies its DeepSpeed config)
distills without weight decay, since the drafter starts from a converted, function-preserving
initialisation that decay would pull away from. ``DistillConfig.optim`` and the ``osprey train
distill`` options both read this table; it is free of torch so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from osprey_train.trainer.config import OptimConfig

__all__ = ["DISTILL_OPTIM_DEFAULTS", "PRETRAIN_OPTIM_DEFAULTS", "distill_optim", "pretrain_optim"]

PRETRAIN_OPTIM_DEFAULTS: dict[str, Any] = {}
"""Stage 2 uses ``OptimConfig`` as it is (it is the paper's pretraining recipe)."""
DISTILL_OPTIM_DEFAULTS: dict[str, Any] = {"weight_decay": 0.0}
"""Stage 4: no weight decay (EAGLE-3 / SpecForge practice)."""


def pretrain_optim(**changes: Any) -> OptimConfig:
    """Stage 2's optimizer settings, with ``changes`` applied."""
    return OptimConfig(**{**PRETRAIN_OPTIM_DEFAULTS, **changes})


def distill_optim(**changes: Any) -> OptimConfig:
    """Stage 4's optimizer settings, with ``changes`` applied."""
    return OptimConfig(**{**DISTILL_OPTIM_DEFAULTS, **changes})

"""What every drafter shares: the base class, its config, attention backends, layers, checkpoints.

Each architecture's own model class lives in its folder, ``osprey_train/drafters/<arch>/model.py``.

See docs/models.md.
"""

from __future__ import annotations

from osprey_train.models.attention import AttentionBackend, CausalAttention, KVCacheAttention
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.io import load_drafter, save_drafter

__all__ = [
    "DrafterConfig", "Drafter", "load_drafter", "save_drafter",
    "AttentionBackend", "CausalAttention", "KVCacheAttention",
]

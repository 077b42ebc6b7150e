"""Drafter models: the Osprey drafter, the EAGLE-3 baseline, attention backends, checkpoints.

See docs/models.md.
"""

from __future__ import annotations

from osprey_train.models.attention import AttentionBackend, CausalAttention, KVCacheAttention
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.eagle3 import Eagle3Drafter
from osprey_train.models.io import load_drafter, save_drafter
from osprey_train.models.osprey import OspreyDrafter

__all__ = [
    "DrafterConfig", "Drafter", "OspreyDrafter", "Eagle3Drafter", "load_drafter", "save_drafter",
    "AttentionBackend", "CausalAttention", "KVCacheAttention",
]

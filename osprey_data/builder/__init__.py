"""The builder: run a target once over conversations and write a feature store.

``from osprey_data.builder import BuildConfig`` (torch-free: checking a config loads no backend) and
``from osprey_data.builder.runner import run``. The target itself (loading, identity, taps)
lives in :mod:`osprey_data.target_model` and the conversation readers and chat rendering in
:mod:`osprey_data.conversation`; the builder combines them with its backends and the store.
"""

from __future__ import annotations

from osprey_data.builder.config import BACKEND_NAMES, BuildConfig

__all__ = ["BuildConfig", "BACKEND_NAMES"]

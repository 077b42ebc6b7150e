"""The builder: run a target once over conversations and write a feature store.

``from osprey_data.builder import run, BuildConfig``. The target itself (loading, identity, taps)
lives in :mod:`osprey_data.target` and the conversation readers and chat rendering in
:mod:`osprey_data.conversation`; the builder combines them with its backends and the store.
"""

from __future__ import annotations

from osprey_data.builder.config import BuildConfig
from osprey_data.builder.runner import BuildSummary, run

__all__ = ["run", "BuildConfig", "BuildSummary"]

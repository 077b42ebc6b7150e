"""The builder: run a target once over conversations and write a feature store.

``from osprey_data.builder import run, BuildConfig``. Both are resolved lazily so that importing
``osprey_data.builder.target`` (as the drafter and live-decoding code do) stays cheap and does
not pull in the backends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from osprey_data.builder.config import BuildConfig
    from osprey_data.builder.runner import BuildSummary, run

__all__ = ["run", "BuildConfig", "BuildSummary"]

_LAZY = {
    "run": "osprey_data.builder.runner",
    "BuildSummary": "osprey_data.builder.runner",
    "BuildConfig": "osprey_data.builder.config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'osprey_data.builder' has no attribute {name!r}")

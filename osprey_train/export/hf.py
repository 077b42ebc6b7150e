"""``--format hf``: the documented Osprey drafter checkpoint (either arch), for Osprey's own tools.

Layout: ``model.safetensors`` (tensor names as in the drafter modules, see docs/models.md) +
``config.json`` (``format: osprey-drafter``, schema ``schemas/drafter-config.v1.json``) + the
target tokenizer and stats files when the source drafter folder had them. Loads back with
``osprey_train.models.load_drafter``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from osprey_train.drafters.registry import drafter_spec
from osprey_train.export.common import copy_side_files, write_folder
from osprey_train.models.base import Drafter
from osprey_train.models.io import build_drafter, load_drafter, save_drafter

__all__ = ["write_hf", "read_hf"]


def write_hf(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool) -> Path:
    """Write ``model`` (cast to ``dtype``) as an Osprey drafter checkpoint."""
    drafter_spec(model.config.arch).check_export(model.config, "hf")
    def fill(tmp: Path) -> None:
        copy = build_drafter(model.config)
        copy.load_state_dict(model.state_dict())
        for p in copy.parameters():   # parameters only: the int64 d2t buffer keeps its dtype
            p.data = p.data.to(dtype)
        save_drafter(copy, tmp)
        copy_side_files(source_dir, tmp)

    return write_folder(out, fill, overwrite=overwrite)


def read_hf(path: Path) -> Drafter:
    """Load an ``hf`` export (dtype as stored)."""
    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    dtype = {"BF16": torch.bfloat16, "F16": torch.float16}.get(next((d for d in dtypes if d in ("BF16", "F16")), ""),
                                                              torch.float32)
    return load_drafter(path, dtype=dtype)

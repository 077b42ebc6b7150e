"""``whole_target_osprey``: an Osprey drafter whose backbone is the whole target, its conditioning
switched on with small seeded noise: it drafts mostly right (so engines accept many drafts), and its
drafts depend on the taps and W_c (so a wrong tap convention or a mangled export shows)."""

from __future__ import annotations

from pathlib import Path

import torch

from osprey_train.models import load_drafter, save_drafter
from osprey_train.stages.configs import ConvertConfig
from osprey_train.stages.convert import run as convert
from osprey_train.stages.prune import PruneConfig
from osprey_train.stages.prune import run as prune

__all__ = ["whole_target_osprey"]


def whole_target_osprey(target: Path, work: Path, *, layers: int, noise: float, taps=None, seed: int = 0) -> Path:
    """Prune ``target`` to all its ``layers``, convert it for itself, put ``noise``-scaled seeded
    normal values into the zero-initialised condition columns; returns the saved drafter folder."""
    torch.manual_seed(seed)
    full = prune(PruneConfig(source=str(target), layers=layers, out=work / "full")).out
    init = convert(ConvertConfig(arch="osprey", backbone=full, target=str(target), taps=taps,
                                 out=work / "osprey-init")).out
    osprey = load_drafter(init)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in osprey.extra_column_blocks():
            block.copy_(torch.randn(block.shape, generator=generator) * noise)
    return save_drafter(osprey, work / "osprey")

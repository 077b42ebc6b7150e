"""Stage 3 (convert): the initial drafter of one architecture for one target.

``osprey train convert --arch A ...`` runs the convert entry that arch ``A`` registers
(``DrafterSpec.convert``): for ``osprey`` :func:`osprey_train.drafters.osprey.convert.convert_osprey`
(a pre-trained backbone's layers, the vocabulary aligned to the target, the target's taps fed to
every layer through zero-initialised columns), for ``eagle3``
:func:`osprey_train.drafters.eagle3.convert.convert_eagle3` (random body, target embedding, store
draft vocabulary). Every entry writes ``model.safetensors`` + ``config.json`` (+ the target
tokenizer and its statistics files) atomically and returns a :class:`ConvertResult`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from osprey_data.cpu_threads import note_to_stderr, torch_threads
from osprey_train.drafters.registry import drafter_spec
from osprey_train.stages.configs import ConvertConfig

__all__ = ["ConvertConfig", "ConvertResult", "run", "STATS_FILE"]

STATS_FILE = "alignment_stats.json"


@dataclass(kw_only=True)
class ConvertResult:
    """What convert wrote."""

    out: Path
    """The drafter folder."""
    stats: dict
    """alignment_stats.json (osprey, plus ``draft_vocab`` with --draft-vocab) or draft_vocab.json (eagle3)."""


def run(config: ConvertConfig) -> ConvertResult:
    """Write the initial drafter of ``config.arch``: its registered convert entry (``DrafterSpec.convert``)."""
    with torch_threads(config.threads, note_to_stderr):
        return drafter_spec(config.arch).load("convert")(config)

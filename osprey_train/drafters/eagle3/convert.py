"""EAGLE-3 baseline initialisation: the ``eagle3`` arch's convert entry
(``osprey train convert --arch eagle3 --target M --store S``).

- body: one random Llama-style layer shaped like the target (hidden size, heads, MLP size, rotary),
  plus ``num_layers - 1`` plain ones for the multi-layer control (the paper's Table 6);
- embedding: copied from the target and frozen;
- draft vocabulary: :mod:`osprey_train.stages.draft_vocab` (the store's most frequent
  loss-masked target tokens);
- tap layers and target identity from the store manifest.

Legend: V target vocab, Vd draft vocab, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from osprey_data.errors import ConfigError
from osprey_data.store import StoreReader
from osprey_data.target_model import TapLayers, TargetIdentity
from osprey_train.drafters.eagle3.arch import DEFAULT_DRAFT_VOCAB
from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.hf import hf_rope
from osprey_train.models.io import write_drafter_folder
from osprey_train.stages.configs import ConvertConfig
from osprey_train.stages.convert import ConvertResult
from osprey_train.stages.draft_vocab import VOCAB_FILE, check_draft_vocab_size, draft_vocab_from_store
from osprey_train.stages.target_side import resolve_target_side

__all__ = ["Eagle3InitConfig", "Eagle3InitResult", "run", "init_eagle3", "convert_eagle3"]


@dataclass(kw_only=True)
class Eagle3InitConfig:
    """Options of the EAGLE-3 initialisation."""

    target: str
    """Target model (folder / .gguf / hub id) the store was built with."""
    store: str
    """Feature store of that target (draft vocabulary counts, taps, identity)."""
    out: Path
    """Output drafter folder."""
    draft_vocab_size: int = 32000
    """Draft vocabulary size (clipped to the target vocabulary with an error if larger)."""
    seed: int = 0
    """Seed of the random body."""
    num_layers: int = 1
    """Decoder layers: 1 is EAGLE-3; more adds plain layers (the parameter-matched control)."""
    overwrite: bool = False
    """Replace ``out`` if it exists."""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise ConfigError(f"eagle3 init: --eagle3-layers must be a positive integer, got {self.num_layers!r}")
        if self.draft_vocab_size < 1:
            raise ConfigError(f"eagle3 init: --draft-vocab must be positive, got {self.draft_vocab_size}")


@dataclass(kw_only=True)
class Eagle3InitResult:
    """What the EAGLE-3 init wrote."""

    out: Path
    """The drafter folder."""
    stats: dict
    """draft_vocab.json contents (coverage of loss-masked tokens etc.)."""


@torch.no_grad()
def init_eagle3(target_model: Any, identity: TargetIdentity, taps: TapLayers, draft_ids: np.ndarray, *,
                seed: int = 0, num_layers: int = 1) -> Eagle3Drafter:
    """A randomly initialised Eagle3Drafter shaped like ``target_model`` with its embedding."""
    cfg = target_model.config.get_text_config() if hasattr(target_model.config, "get_text_config") \
        else target_model.config
    theta, scaling = hf_rope(cfg, where=identity.name_or_path)
    heads = cfg.num_attention_heads
    embed = target_model.get_input_embeddings().weight
    config = DrafterConfig(
        arch="eagle3", family="llama", num_layers=num_layers, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_attention_heads=heads,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        rms_norm_eps=float(cfg.rms_norm_eps), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=cfg.max_position_embeddings, vocab_size=identity.vocab_size,
        draft_vocab_size=int(draft_ids.shape[0]), target_hidden_size=identity.hidden_size,
        tap_layers=taps, target=identity,
    )
    rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Eagle3Drafter(config)
    finally:
        torch.random.set_rng_state(rng)
    if tuple(embed.shape) != tuple(model.embed_tokens.weight.shape):
        raise ConfigError(f"eagle3 init: target embedding has shape {tuple(embed.shape)}, expected "
                          f"{tuple(model.embed_tokens.weight.shape)} (vocab_size, hidden_size)")
    model.embed_tokens.weight.copy_(embed.detach().float())
    model.set_draft_vocab(torch.as_tensor(draft_ids, dtype=torch.long))
    return model.eval()


def run(config: Eagle3InitConfig) -> Eagle3InitResult:
    """Build the EAGLE-3 baseline drafter for the store's target and write it to ``config.out``."""
    if config.out.exists() and not config.overwrite:
        raise ConfigError(f"convert: output folder {config.out} exists; pass --overwrite or choose another --out")
    header = StoreReader(config.store).header   # before the target loads: its vocabulary bounds --draft-vocab
    check_draft_vocab_size(config.draft_vocab_size, header.target.vocab_size, source=f"store {config.store}")
    side = resolve_target_side(target=config.target, store=config.store, taps=None, need_model=True)
    draft_ids, stats = draft_vocab_from_store(config.store, side.identity.vocab_size, config.draft_vocab_size)
    model = init_eagle3(side.model, side.identity, side.taps, draft_ids, seed=config.seed,
                        num_layers=config.num_layers)
    stats["tap_layers"] = side.taps.to_dict()
    write_drafter_folder(model, config.out, tokenizer=side.tokenizer, extra={VOCAB_FILE: stats},
                         overwrite=config.overwrite)
    return Eagle3InitResult(out=config.out, stats=stats)


def convert_eagle3(config: ConvertConfig) -> ConvertResult:
    """``convert --arch eagle3``: random body, target embedding, store draft vocabulary (:func:`run`)."""
    size = DEFAULT_DRAFT_VOCAB if config.draft_vocab_size is None else config.draft_vocab_size
    result = run(Eagle3InitConfig(target=config.target, store=config.store, out=config.out,
                                  draft_vocab_size=size, seed=config.seed,
                                  num_layers=config.eagle3_layers, overwrite=config.overwrite))
    return ConvertResult(out=result.out, stats=result.stats)

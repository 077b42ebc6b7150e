"""EAGLE-3 baseline initialisation (``osprey train convert --arch eagle3 --target M --store S``).

- body: one random Llama-style layer shaped like the target (hidden size, heads, MLP size, rotary),
  plus ``num_layers - 1`` plain ones for the multi-layer control (the paper's Table 6);
- embedding: copied from the target and frozen;
- draft vocabulary: the ``draft_vocab_size`` target tokens that occur most often at loss-masked
  positions of the store (ties broken by lower id; if the store has fewer distinct tokens, the
  remaining slots take the lowest unused target ids), sorted by target id so that the engines'
  offset map ``d2t[i] = target_id - i`` is non-negative;
- tap layers and target identity from the store manifest.

Legend: V target vocab, Vd draft vocab, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from osprey_data.errors import ConfigError, StoreError
from osprey_data.store import StoreReader
from osprey_data.target_model import TapLayers, TargetIdentity
from osprey_train.models.config import DrafterConfig
from osprey_train.models.eagle3 import Eagle3Drafter
from osprey_train.models.hf import hf_rope
from osprey_train.models.io import write_drafter_folder
from osprey_train.stages.target_side import resolve_target_side

__all__ = ["Eagle3InitConfig", "Eagle3InitResult", "run", "loss_masked_token_counts", "select_draft_vocab",
           "draft_vocab_from_store", "check_draft_vocab_size", "init_eagle3", "VOCAB_FILE"]

VOCAB_FILE = "draft_vocab.json"


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


def loss_masked_token_counts(store: str, vocab_size: int) -> np.ndarray:
    """(V,) int64 counts of target token ids at loss-masked positions over the whole store."""
    table = StoreReader(store).table(columns=["token_ids", "loss_mask"])
    counts = np.zeros(vocab_size, dtype=np.int64)
    ids_col, mask_col = table.column("token_ids"), table.column("loss_mask")
    for row in range(table.num_rows):
        ids = np.asarray(ids_col[row].as_py(), dtype=np.int64)
        mask = np.asarray(mask_col[row].as_py()).astype(bool)
        if ids.shape != mask.shape:
            raise StoreError(f"store {store}: sample {row} has {ids.size} token ids but {mask.size} mask entries")
        picked = ids[mask]
        if picked.size and (picked.min() < 0 or picked.max() >= vocab_size):
            raise StoreError(f"store {store}: sample {row} has token ids outside [0, {vocab_size})")
        counts += np.bincount(picked, minlength=vocab_size)
    return counts


def check_draft_vocab_size(size: int, vocab: int, *, source: str | None = None) -> None:
    """Refuse a draft vocabulary larger than the target's (``source``: where ``vocab`` was read)."""
    if size > vocab:
        read = f" (per {source})" if source else ""
        raise ConfigError(f"convert: --draft-vocab {size} exceeds the target vocabulary ({vocab}){read}; "
                          f"pass --draft-vocab {vocab} or less")


def select_draft_vocab(counts_V: np.ndarray, size: int) -> np.ndarray:
    """Top-``size`` ids by count (ties: lower id first), padded with unused low ids, sorted ascending."""
    vocab = counts_V.shape[0]
    check_draft_vocab_size(size, vocab)
    order = np.lexsort((np.arange(vocab), -counts_V))  # by count desc, then id asc
    return np.sort(order[:size])


def draft_vocab_from_store(store: str, vocab_size: int, size: int) -> tuple[np.ndarray, dict]:
    """The draft vocabulary of ``size`` target ids chosen from ``store`` and its ``draft_vocab.json`` stats.

    Shared by the EAGLE-3 init and the Osprey conversion with ``--draft-vocab``.
    """
    counts = loss_masked_token_counts(store, vocab_size)
    draft_ids = select_draft_vocab(counts, size)
    total = int(counts.sum())
    stats = {
        "draft_vocab_size": int(draft_ids.shape[0]), "target_vocab_size": vocab_size,
        "loss_masked_tokens": total, "distinct_loss_masked_tokens": int((counts > 0).sum()),
        "coverage": round(float(counts[draft_ids].sum()) / total, 6) if total else 0.0,
        "store": str(store),
    }
    return draft_ids, stats


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

"""DFlash initialisation: the ``dflash`` arch's convert entry
(``osprey train convert --arch dflash --target M --store S [--eagle3-layers N] [--arch-option block_size=16]``).

- body: ``N`` random Qwen3-style layers (per-head q/k norms, no bias) shaped like the target
  (hidden size, heads, key/value heads, head size, MLP size), with the draft's own default RoPE at
  the target's base; vLLM's DFlash model runs exactly this layer whatever the target's family;
- ``fc`` (taps -> hidden) random, ``hidden_norm`` and ``norm`` at 1;
- embedding and LM head: copied from the target and frozen (vLLM serves the target's own);
- tap layers and target identity from the store manifest;
- ``arch_options``: ``block_size`` (default 8), ``mask_token_id`` (default: the tokenizer's mask
  token, else the highest token id never seen among the store's response tokens, so that a
  mask slot never reads like a real response token), ``anchor_fraction``.

Legend: V vocabulary, D hidden.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from osprey_data.errors import ConfigError
from osprey_train.drafters.dflash.arch import DEFAULT_ANCHOR_FRACTION, DEFAULT_BLOCK_SIZE
from osprey_train.drafters.dflash.model import DFlashDrafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.hf import hf_rope
from osprey_train.models.io import write_drafter_folder
from osprey_train.stages.configs import ConvertConfig
from osprey_train.stages.convert import ConvertResult
from osprey_train.stages.draft_vocab import loss_masked_token_counts
from osprey_train.stages.target_side import resolve_target_side

__all__ = ["convert_dflash", "init_dflash", "default_mask_token"]


def default_mask_token(tokenizer: Any, counts_V: np.ndarray) -> int:
    """The tokenizer's mask token, else the highest id that no stored response token uses."""
    explicit = getattr(tokenizer, "mask_token_id", None)
    if explicit is not None and 0 <= int(explicit) < counts_V.shape[0]:
        return int(explicit)
    unused = np.flatnonzero(counts_V == 0)
    if unused.size == 0:
        raise ConfigError("convert --arch dflash: every token id occurs in the store's responses; choose the mask "
                          "token with --arch-option mask_token_id=ID")
    return int(unused[-1])


@torch.no_grad()
def init_dflash(target_model: Any, identity: Any, taps: Any, *, num_layers: int, arch_options: dict,
                seed: int = 0) -> DFlashDrafter:
    """A DFlash drafter shaped like ``target_model``: random layers and ``fc``, the target's embedding and head."""
    cfg = target_model.config.get_text_config() if hasattr(target_model.config, "get_text_config") \
        else target_model.config
    theta, _ = hf_rope(cfg, where=identity.name_or_path)   # the draft's own RoPE: default type, the target's base
    heads = cfg.num_attention_heads
    config = DrafterConfig(
        arch="dflash", family="qwen3", qk_norm=True, num_layers=num_layers, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_attention_heads=heads,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        rms_norm_eps=float(cfg.rms_norm_eps), rope_theta=theta, rope_scaling=None,
        max_position_embeddings=cfg.max_position_embeddings, vocab_size=identity.vocab_size,
        draft_vocab_size=identity.vocab_size, target_hidden_size=identity.hidden_size, tap_layers=taps,
        target=identity, arch_options=arch_options,
    )
    rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = DFlashDrafter(config)
    finally:
        torch.random.set_rng_state(rng)
    embed = target_model.get_input_embeddings().weight
    head = target_model.get_output_embeddings().weight
    for name, source, dest in (("embedding", embed, model.embed_tokens.weight), ("LM head", head, model.lm_head.weight)):
        if tuple(source.shape) != tuple(dest.shape):
            raise ConfigError(f"convert --arch dflash: the target's {name} has shape {tuple(source.shape)}, expected "
                              f"{tuple(dest.shape)} (vocab_size, hidden_size)")
        dest.copy_(source.detach().float())
    return model.eval()


def convert_dflash(config: ConvertConfig) -> ConvertResult:
    """``convert --arch dflash``: the drafter for the store's target, written to ``config.out``."""
    options = dict(config.arch_options)
    side = resolve_target_side(target=config.target, store=config.store, taps=None, need_model=True)
    counts = loss_masked_token_counts(config.store, side.identity.vocab_size)
    options.setdefault("block_size", DEFAULT_BLOCK_SIZE)
    options.setdefault("anchor_fraction", DEFAULT_ANCHOR_FRACTION)
    if "mask_token_id" not in options:
        options["mask_token_id"] = default_mask_token(side.tokenizer, counts)
    model = init_dflash(side.model, side.identity, side.taps, num_layers=config.eagle3_layers,
                        arch_options=options, seed=config.seed)
    stats = {"tap_layers": side.taps.to_dict(), "arch_options": options,
             "mask_token_seen_in_responses": int(counts[options["mask_token_id"]])}
    write_drafter_folder(model, config.out, tokenizer=side.tokenizer, overwrite=config.overwrite)
    return ConvertResult(out=config.out, stats=stats)

"""DFlash initialisation: the ``dflash`` arch's convert entry
(``osprey train convert --arch dflash --target M --store S [--backbone DIR] [--eagle3-layers N]
[--arch-option block_size=16]``).

From scratch (no ``--backbone``, ``arch_options.init = "scratch"``):

- body: ``N`` random Qwen3-style layers (per-head q/k norms, no bias) shaped like the target
  (hidden size, heads, key/value heads, head size, MLP size), with the draft's own default RoPE at
  the target's base; vLLM's DFlash model runs exactly this layer whatever the target's family;
- ``fc`` (taps -> hidden) random, ``hidden_norm`` and ``norm`` at 1;
- embedding and LM head: copied from the target and frozen (vLLM serves the target's own);

From a pre-trained backbone (``--backbone DIR``, the pruned and Stage-2 model of the Osprey recipe,
``arch_options.init = "backbone"``), the DFlash analogue of the Osprey conversion:

- body: the backbone's decoder layers, copied 1:1 (``--eagle3-layers`` does not apply: the depth is
  the backbone's), its final norm and RoPE; a Llama backbone keeps its layers without per-head
  q/k norms (an RMSNorm is never the identity, so adding one would change what they compute);
- embedding and LM head: the backbone's, vocabulary-aligned to the target as the Osprey
  conversion aligns them (shared token rows copied, others the mean of their source sub-tokens),
  frozen like the scratch drafter's;
- the target's features enter through a zero-initialised path: ``fc`` random, ``hidden_norm`` at
  0, so every context key and value is exactly 0 at initialisation and the block runs through
  the backbone's own weights. Two differences from the backbone are DFlash's by construction and
  stay: the block ``[anchor, mask, ...]`` attends non-causally, and a zero key still takes softmax
  mass (``exp(0)`` per context position) from the block's own slots.

Both:

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

from osprey_data.errors import ConfigError, InputError
from osprey_train.drafters.dflash.arch import DEFAULT_ANCHOR_FRACTION, DEFAULT_BLOCK_SIZE
from osprey_train.drafters.dflash.model import DFlashDrafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.hf import copy_backbone_layers, drafter_config_from_hf, hf_rope
from osprey_train.models.io import write_drafter_folder
from osprey_train.stages.configs import ConvertConfig
from osprey_train.stages.convert import STATS_FILE, ConvertResult
from osprey_train.stages.draft_vocab import loss_masked_token_counts
from osprey_train.stages.prune import load_source
from osprey_train.stages.target_side import TargetSide, resolve_target_side
from osprey_train.stages.vocab_align import align_backbone_embeddings

__all__ = ["convert_dflash", "init_dflash", "init_dflash_from_backbone", "default_mask_token"]


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


@torch.no_grad()
def init_dflash_from_backbone(backbone: Any, source_tokenizer: Any, side: TargetSide, *, arch_options: dict,
                              seed: int = 0, where: str = "backbone") -> tuple[DFlashDrafter, Any]:
    """(DFlashDrafter, VocabAlignment): the backbone's layers, norm and aligned embedding and head; the
    context path ``fc`` random behind ``hidden_norm`` at 0 (silent at initialisation)."""
    identity = side.identity
    config = drafter_config_from_hf(
        backbone.config, where=where, arch="dflash", vocab_size=identity.vocab_size,
        draft_vocab_size=identity.vocab_size, target_hidden_size=identity.hidden_size, tap_layers=side.taps,
        target=identity, arch_options={**arch_options, "init": "backbone"},
    )   # DrafterConfig's dflash rules refuse a family whose layer DFlash does not run (qwen2's q/k/v bias)
    embed_VtD, head_VtD, alignment = align_backbone_embeddings(backbone, source_tokenizer, side.tokenizer,
                                                               target_vocab_size=config.vocab_size)
    rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = DFlashDrafter(config)   # fc drawn here, with the seed
    finally:
        torch.random.set_rng_state(rng)
    state = {k: v.detach().float() for k, v in backbone.state_dict().items()}
    copy_backbone_layers(model.layers, state, where=where)
    model.norm.weight.copy_(state["model.norm.weight"])
    model.embed_tokens.weight.copy_(embed_VtD)
    model.lm_head.weight.copy_(head_VtD)
    model.hidden_norm.weight.zero_()
    return model.eval(), alignment


def _arch_options(config: ConvertConfig, side: TargetSide) -> tuple[dict, np.ndarray]:
    """The options convert writes (defaults filled in) and the store's response-token counts."""
    options = dict(config.arch_options)
    if "init" in options:
        raise ConfigError("convert --arch dflash: arch option init is written by convert (backbone with "
                          "--backbone, else scratch); do not pass it")
    counts = loss_masked_token_counts(config.store, side.identity.vocab_size)
    options.setdefault("block_size", DEFAULT_BLOCK_SIZE)
    options.setdefault("anchor_fraction", DEFAULT_ANCHOR_FRACTION)
    if "mask_token_id" not in options:
        options["mask_token_id"] = default_mask_token(side.tokenizer, counts)
    return options, counts


def convert_dflash(config: ConvertConfig) -> ConvertResult:
    """``convert --arch dflash``: the drafter for the store's target, written to ``config.out``."""
    extra = {}
    if config.backbone is None:
        side = resolve_target_side(target=config.target, store=config.store, taps=None, need_model=True)
        options, counts = _arch_options(config, side)
        model = init_dflash(side.model, side.identity, side.taps, num_layers=config.eagle3_layers,
                            arch_options={**options, "init": "scratch"}, seed=config.seed)
        stats: dict[str, Any] = {}
    else:
        if not (config.backbone / "config.json").is_file():
            raise InputError(f"convert: --backbone {config.backbone} has no config.json; pass the HF folder "
                             "written by `osprey train prune` / `osprey train pretrain`")
        side = resolve_target_side(target=config.target, store=config.store, taps=None)
        options, counts = _arch_options(config, side)
        backbone, source_tokenizer = load_source(str(config.backbone))
        model, alignment = init_dflash_from_backbone(backbone, source_tokenizer, side, arch_options=options,
                                                     seed=config.seed, where=str(config.backbone))
        stats = {**alignment.stats(), "backbone": str(config.backbone)}
        extra[STATS_FILE] = stats
    stats = {**stats, "tap_layers": side.taps.to_dict(), "arch_options": dict(model.config.arch_options),
             "mask_token_seen_in_responses": int(counts[options["mask_token_id"]])}
    write_drafter_folder(model, config.out, tokenizer=side.tokenizer, extra=extra, overwrite=config.overwrite)
    return ConvertResult(out=config.out, stats=stats)

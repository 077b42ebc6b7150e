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
- ``--arch-option add_qk_norm=true`` (a Llama backbone): the layers get the per-head q/k norms of
  the engines' DFlash layer anyway, so that vLLM and SGLang serve the drafter. What they change is
  kept small: each norm's weight is the mean RMS of that layer's head vectors (q or k) on the
  store's tokens run through the backbone, so a head vector of typical length keeps its length and
  every attention logit keeps its direction; only a vector's deviation from the typical length is
  lost. At initialisation the drafter is then close to, not equal to, the backbone (tested);
  distillation adapts the rest;
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
from osprey_data.store import StoreReader
from osprey_train.drafters.dflash.arch import DEFAULT_ANCHOR_FRACTION, DEFAULT_BLOCK_SIZE
from osprey_train.drafters.dflash.model import DFlashDrafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.hf import copy_backbone_layers, drafter_config_from_hf, hf_family, hf_rope
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
                              seed: int = 0, where: str = "backbone",
                              calibration_ids: list[torch.Tensor] = ()) -> tuple[DFlashDrafter, Any]:
    """(DFlashDrafter, VocabAlignment): the backbone's layers, norm and aligned embedding and head; the
    context path ``fc`` random behind ``hidden_norm`` at 0 (silent at initialisation). With
    ``add_qk_norm``, the q/k norms' weights come from :func:`head_rms_per_layer` on
    ``calibration_ids`` (sequences of the backbone's own token ids)."""
    identity = side.identity
    layer = {}
    if arch_options.get("add_qk_norm"):
        family = hf_family(backbone.config, where=where)
        if family != "llama":
            raise ConfigError(f"convert --arch dflash: add_qk_norm gives a Llama backbone's layers q/k norms; "
                              f"{where} is a {family!r} model, whose layers already are what the engines run")
        layer = {"family": "qwen3", "qk_norm": True}
    config = drafter_config_from_hf(
        backbone.config, where=where, arch="dflash", vocab_size=identity.vocab_size,
        draft_vocab_size=identity.vocab_size, target_hidden_size=identity.hidden_size, tap_layers=side.taps,
        target=identity, arch_options={**arch_options, "init": "backbone"}, **layer,
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
    added = ("self_attn.q_norm.weight", "self_attn.k_norm.weight") if arch_options.get("add_qk_norm") else ()
    copy_backbone_layers(model.layers, state, where=where, not_in_source=added)
    model.norm.weight.copy_(state["model.norm.weight"])
    model.embed_tokens.weight.copy_(embed_VtD)
    model.lm_head.weight.copy_(head_VtD)
    model.hidden_norm.weight.zero_()
    if arch_options.get("add_qk_norm"):
        for layer, (rms_q, rms_k) in zip(model.layers, head_rms_per_layer(backbone, calibration_ids)):
            layer.self_attn.q_norm.weight.fill_(rms_q)
            layer.self_attn.k_norm.weight.fill_(rms_k)
    return model.eval(), alignment


@torch.no_grad()
def head_rms_per_layer(backbone: Any, token_ids: list[torch.Tensor]) -> list[tuple[float, float]]:
    """Per decoder layer of an HF ``backbone``: the mean RMS of its query and key head vectors (before
    RoPE, which does not change a vector's length) over ``token_ids`` (sequences), read by hooks on
    ``q_proj`` / ``k_proj``."""
    layers = backbone.model.layers
    head_dim = getattr(backbone.config, "head_dim", None) or backbone.config.hidden_size // backbone.config.num_attention_heads
    sums = [[0.0, 0.0] for _ in layers]
    count = [0, 0]

    def hook(i: int, which: int):
        def record(_module, _inputs, out):
            heads = out.float().reshape(-1, head_dim)
            sums[i][which] += float(heads.pow(2).mean(dim=-1).sqrt().sum())
            if i == 0:
                count[which] += heads.shape[0]
        return record

    handles = [proj.register_forward_hook(hook(i, which)) for i, layer in enumerate(layers)
               for which, proj in enumerate((layer.self_attn.q_proj, layer.self_attn.k_proj))]
    try:
        for ids in token_ids:
            backbone(ids[None].long())
    finally:
        for h in handles:
            h.remove()
    if not count[0]:
        raise ConfigError("convert --arch dflash: add_qk_norm needs tokens to calibrate on; the store has none")
    return [(q / count[0], k / count[1]) for q, k in sums]


CALIBRATION_SAMPLES = 8
"""Store samples whose text calibrates ``add_qk_norm`` (at most 512 backbone tokens each)."""


def calibration_token_ids(store: str, target_tokenizer: Any, source_tokenizer: Any) -> list[torch.Tensor]:
    """The first store samples' text (prompt and response), re-tokenized for the backbone: the backbone
    may have another vocabulary than the target's."""
    reader = StoreReader(store)
    out = []
    for i in range(min(CALIBRATION_SAMPLES, len(reader))):
        text = target_tokenizer.decode(list(reader.sample(i).token_ids))
        out.append(torch.tensor(source_tokenizer(text, add_special_tokens=False)["input_ids"][:512]))
    return [ids for ids in out if ids.numel()]


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
        calibration = calibration_token_ids(config.store, side.tokenizer, source_tokenizer) \
            if options.get("add_qk_norm") else []
        model, alignment = init_dflash_from_backbone(backbone, source_tokenizer, side, arch_options=options,
                                                     seed=config.seed, where=str(config.backbone),
                                                     calibration_ids=calibration)
        stats = {**alignment.stats(), "backbone": str(config.backbone)}
        extra[STATS_FILE] = stats
    stats = {**stats, "tap_layers": side.taps.to_dict(), "arch_options": dict(model.config.arch_options),
             "mask_token_seen_in_responses": int(counts[options["mask_token_id"]])}
    write_drafter_folder(model, config.out, tokenizer=side.tokenizer, extra=extra, overwrite=config.overwrite)
    return ConvertResult(out=config.out, stats=stats)

"""The ``osprey`` arch's convert entry: turn a pre-trained backbone into an Osprey drafter for one target.

Steps (``osprey train convert --backbone DIR --target MODEL|--store STORE --out DIR``):

1. target side (:mod:`target_side`): identity + tap layers from the store manifest (``--store``)
   or from the target model (``--target``: ``identify_target`` and ``default_tap_layers`` unless
   ``--taps``); the target tokenizer from ``--target`` or the store's ``target.name_or_path``;
2. vocabulary alignment of the embedding and the LM head (``vocab_align.align_vocab``), stats
   written to ``alignment_stats.json``;
3. optionally (``--draft-vocab N``, needs ``--store``) a reduced draft vocabulary, EAGLE-3's
   mechanism: the N target tokens most frequent at the store's loss-masked positions
   (:mod:`osprey_train.stages.draft_vocab`); the aligned LM head keeps only their rows and the
   drafter stores the draft -> target map ``d2t``; stats in ``draft_vocab.json``. On the kept
   tokens the drafter's logits are exactly the full-vocabulary ones;
4. the backbone's decoder layers copied 1:1, q/k/v widened with zero-initialised columns that read
   the condition, W_c initialised non-zero (see :func:`osprey_train.drafters.osprey.model.init_w_c` for why):
   at random, or with ``--arch-option w_c_init=identity`` the identity on the deepest tap;
5. ``model.safetensors`` + ``config.json`` (+ the target tokenizer) written atomically.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from osprey_data.errors import InputError
from osprey_data.store import StoreReader
from osprey_data.target_model import peek_model_config
from osprey_train.drafters.osprey.arch import w_c_init_of
from osprey_train.drafters.osprey.model import OspreyDrafter, identity_w_c, init_w_c
from osprey_train.models.hf import copy_backbone_layers, drafter_config_from_hf, hf_family
from osprey_train.models.io import write_drafter_folder
from osprey_train.stages.configs import ConvertConfig
from osprey_train.stages.convert import STATS_FILE, ConvertResult
from osprey_train.stages.draft_vocab import VOCAB_FILE, check_draft_vocab_size, draft_vocab_from_store
from osprey_train.stages.prune import load_source
from osprey_train.stages.target_side import TargetSide, resolve_target_side
from osprey_train.stages.vocab_align import align_backbone_embeddings

__all__ = ["convert_backbone", "convert_osprey"]


@torch.no_grad()
def convert_backbone(backbone: Any, source_tokenizer: Any, side: TargetSide, *, seed: int = 0,
                     where: str = "backbone", draft_ids: np.ndarray | None = None,
                     arch_options: dict | None = None) -> tuple[Any, Any]:
    """(OspreyDrafter, VocabAlignment) for an HF backbone model and a resolved target side.

    ``draft_ids`` (sorted target ids) makes a reduced draft vocabulary: the LM head keeps those rows.
    ``arch_options``: ``w_c_init`` (``random``, the default, or ``identity`` on the deepest tap).
    """
    identity = side.identity
    draft_vocab_size = identity.vocab_size if draft_ids is None else int(len(draft_ids))
    config = drafter_config_from_hf(
        backbone.config, where=where, vocab_size=identity.vocab_size, draft_vocab_size=draft_vocab_size,
        target_hidden_size=identity.hidden_size, tap_layers=side.taps, target=identity,
        arch_options=dict(arch_options or {}),
    )
    embed_VtD, head_VtD, alignment = align_backbone_embeddings(backbone, source_tokenizer, side.tokenizer,
                                                               target_vocab_size=config.vocab_size)
    drafter = OspreyDrafter(config)
    state = {k: v.detach().float() for k, v in backbone.state_dict().items()}
    copy_backbone_layers(drafter.model.layers, state, where=where)
    drafter.model.norm.weight.copy_(state["model.norm.weight"])
    drafter.model.embed_tokens.weight.copy_(embed_VtD)
    if draft_ids is None:
        drafter.lm_head.weight.copy_(head_VtD)
    else:
        drafter.set_draft_vocab(torch.as_tensor(draft_ids, dtype=torch.long))
        drafter.lm_head.weight.copy_(head_VtD[drafter.draft_to_target])
    for layer in drafter.model.layers:
        layer.cond_norm.weight.fill_(1.0)
    drafter.zero_extra_columns()
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        init_w_c(drafter.w_c)   # drawn either way, so that the seed's stream is the same for both inits
        if w_c_init_of(config) == "identity":
            identity_w_c(drafter.w_c, config.num_taps)
    finally:
        torch.random.set_rng_state(generator_state)
    return drafter.eval(), alignment


def convert_osprey(config: ConvertConfig) -> ConvertResult:
    """``convert --arch osprey``: the steps of the module docstring (the osprey arch's convert entry)."""
    if not (config.backbone / "config.json").is_file():
        raise InputError(f"convert: --backbone {config.backbone} has no config.json; pass the HF folder "
                         "written by `osprey train prune` / `osprey train pretrain`")
    # what config files tell comes first: the backbone's family, the target's taps and vocabulary,
    # the store's tokenizer; the target (without --store) and then the backbone load last
    shape = peek_model_config(str(config.backbone), option="--backbone")
    if shape is not None:
        hf_family(SimpleNamespace(**shape.text_config), where=shape.path)
    if config.draft_vocab_size is not None:
        header = StoreReader(config.store).header
        check_draft_vocab_size(config.draft_vocab_size, header.target.vocab_size, source=f"store {config.store}")
    side = resolve_target_side(target=config.target, store=config.store, taps=config.taps)
    backbone, source_tokenizer = load_source(str(config.backbone))
    draft_ids, vocab_stats = None, None
    if config.draft_vocab_size is not None:
        draft_ids, vocab_stats = draft_vocab_from_store(config.store, side.identity.vocab_size,
                                                        config.draft_vocab_size)
        if len(draft_ids) == side.identity.vocab_size:
            draft_ids = None  # every target token: the full vocabulary, no map needed
    drafter, alignment = convert_backbone(backbone, source_tokenizer, side, seed=config.seed,
                                          where=str(config.backbone), draft_ids=draft_ids,
                                          arch_options=dict(config.arch_options))
    stats = {**alignment.stats(), "backbone": str(config.backbone),
             "target": side.identity.name_or_path, "tap_layers": side.taps.to_dict()}
    extra = {STATS_FILE: stats}
    if vocab_stats is not None:
        extra[VOCAB_FILE] = vocab_stats
        stats = {**stats, "draft_vocab_size": vocab_stats["draft_vocab_size"],
                 "draft_vocab_coverage": vocab_stats["coverage"]}
    write_drafter_folder(drafter, config.out, tokenizer=side.tokenizer, extra=extra, overwrite=config.overwrite)
    return ConvertResult(out=config.out, stats=stats)

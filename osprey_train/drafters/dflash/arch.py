"""Registry entry of the DFlash block drafter: one forward drafts a block, the target's taps as keys/values.

Torch-free (read by the CLI, configs and the study). Its code is in this folder: ``model.py``,
``convert.py`` (Stage 3: random Qwen3 layers shaped like the target with the target's embedding and
head, or a pre-trained backbone's layers, embedding and head with ``--backbone``), ``objective.py`` (block training on the stored response tokens), ``drafting.py`` (offline
drafts and the live session) and ``export.py`` (vLLM's ``DFlashDraftModel`` layout).

``arch_options`` (config.json): ``block_size`` (slots of a trained block: the anchor and
``block_size - 1`` drafts; 8 by default, as speculators and Model-Optimizer train it),
``mask_token_id`` (the token fed at the mask slots, vLLM's ``dflash_config.mask_token_id``),
``init`` (``scratch`` or ``backbone``: written by convert), ``add_qk_norm`` (with ``--backbone`` on a
Llama backbone: give its layers the per-head q/k norms the engines' DFlash layer applies, calibrated
on the store, so that vLLM and SGLang serve it), ``anchor_fraction`` (training: the share of a packed row's eligible response positions drawn
as block anchors at each step) and ``objective`` (training: ``hard``, cross-entropy against the
stored response tokens, or ``topk``, against the stored top-k log-probs of the target, with
``--target-dist`` tail or renorm as for the chain drafters).
"""

from __future__ import annotations

from typing import Any

from osprey_data.errors import ConfigError
from osprey_train.drafters.spec import DrafterSpec

__all__ = ["SPEC", "VLLM_ARCHITECTURE", "DEFAULT_BLOCK_SIZE", "DEFAULT_ANCHOR_FRACTION", "OPTION_KEYS",
           "block_size_of", "mask_token_of", "anchor_fraction_of", "objective_of", "OBJECTIVES", "INITS", "init_of",
           "shares_target_embedding"]

VLLM_ARCHITECTURE = "DFlashDraftModel"
"""``architectures[0]`` of the vLLM and SGLang exports (vLLM's registry: ``qwen3_dflash.DFlashQwen3ForCausalLM``;
SGLang's: ``models/dflash.py``'s ``DFlashDraftModel``): one layout, read by both."""
DEFAULT_BLOCK_SIZE = 8
"""Block slots when ``--arch-option block_size=`` is not given (speculators' and Model-Optimizer's default)."""
DEFAULT_ANCHOR_FRACTION = 0.25
"""Share of a packed row's eligible response positions that anchor a training block per step. A
quarter: on SmolLM2 (docs/results/dflash-first-cpu) every position (1.0) reached the same held-out
acceptance after the same steps (1.078 against 1.090 / 1.065) for four times the LM-head rows."""
OBJECTIVES = ("hard", "topk")
"""What a block's mask slots learn: the stored response tokens (``hard``, the public DFlash trainers'
objective and the default) or the target's stored top-k distribution (``topk``)."""
INITS = ("scratch", "backbone")
"""Where the layers came from: random Qwen3-style layers shaped like the target, with the target's
embedding and head (``scratch``), or a pre-trained backbone's layers, embedding and head
(``backbone``, convert ``--backbone``). Convert writes it."""
OPTION_KEYS = ("block_size", "mask_token_id", "anchor_fraction", "objective", "init", "add_qk_norm")
"""The ``arch_options`` keys a DFlash drafter has (``--arch-option KEY=VALUE`` at convert)."""


def block_size_of(config: Any) -> int:
    """The drafter's trained block size (anchor + drafts)."""
    return int(config.arch_options["block_size"])


def mask_token_of(config: Any) -> int:
    """The token id at the mask slots."""
    return int(config.arch_options["mask_token_id"])


def anchor_fraction_of(config: Any) -> float:
    """Training anchors per eligible response position."""
    return float(config.arch_options.get("anchor_fraction", DEFAULT_ANCHOR_FRACTION))


def init_of(config: Any) -> str:
    """``scratch`` or ``backbone`` (a config written before the backbone variant existed: scratch)."""
    return str(config.arch_options.get("init", INITS[0]))


def objective_of(config: Any) -> str:
    """The training objective of the mask slots (``hard`` when the config does not name one)."""
    return str(config.arch_options.get("objective", OBJECTIVES[0]))


def _check_config(config: Any) -> None:
    options = config.arch_options
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ConfigError(f"drafter config: dflash arch_options has unknown key(s) {unknown}; known: {list(OPTION_KEYS)}")
    for key in ("block_size", "mask_token_id"):
        if key not in options:
            raise ConfigError(f"drafter config: dflash needs arch_options.{key} (osprey train convert --arch dflash "
                              "writes it)")
    block, mask = options["block_size"], options["mask_token_id"]
    if not isinstance(block, int) or isinstance(block, bool) or not 2 <= block <= 64:
        raise ConfigError(f"drafter config: dflash block_size must be an integer in [2, 64], got {block!r}")
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < config.vocab_size:
        raise ConfigError(f"drafter config: dflash mask_token_id must be a token id in [0, {config.vocab_size}), "
                          f"got {mask!r}")
    fraction = options.get("anchor_fraction", DEFAULT_ANCHOR_FRACTION)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError(f"drafter config: dflash anchor_fraction must be a number in (0, 1], got {fraction!r}")
    if options.get("objective", OBJECTIVES[0]) not in OBJECTIVES:
        raise ConfigError(f"drafter config: dflash objective must be one of {list(OBJECTIVES)}, "
                          f"got {options['objective']!r}")
    if options.get("init", INITS[0]) not in INITS:
        raise ConfigError(f"drafter config: dflash init must be one of {list(INITS)}, got {options['init']!r}")
    add_qk_norm = options.get("add_qk_norm", False)
    if not isinstance(add_qk_norm, bool):
        raise ConfigError(f"drafter config: dflash add_qk_norm must be true or false, got {add_qk_norm!r}")
    if add_qk_norm and (init_of(config) != "backbone" or not config.qk_norm):
        raise ConfigError("drafter config: dflash add_qk_norm applies to a drafter converted with --backbone from a "
                          "Llama backbone, whose layers then carry q/k norms (family 'qwen3')")
    if init_of(config) == "scratch" and config.hidden_size != config.target_hidden_size:
        raise ConfigError(f"drafter config: a dflash drafter from scratch uses the target's embedding, so its hidden "
                          f"size equals the target's ({config.target_hidden_size}), got {config.hidden_size}")
    if (config.family, config.qk_norm) not in (("qwen3", True), ("llama", False)):
        raise ConfigError(f"drafter config: dflash layers are Qwen3-style (family 'qwen3', qk_norm), as vLLM's "
                          f"DFlashDraftModel runs them, or Llama-style (family 'llama', no q/k norm) when started "
                          f"from a Llama backbone; got family {config.family!r}, qk_norm {config.qk_norm}")
    if config.attention_bias:
        raise ConfigError("drafter config: dflash has no attention bias")
    if config.draft_vocab_size != config.vocab_size:
        raise ConfigError(f"drafter config: dflash drafts over the full target vocabulary; "
                          f"draft_vocab_size {config.draft_vocab_size} != vocab_size {config.vocab_size}")
    if config.rope_scaling is not None:
        raise ConfigError("drafter config: dflash has its own default RoPE (no rope_scaling)")


def shares_target_embedding(config: Any) -> bool:
    """Whether the drafter's embedding and LM head are the target's own (convert from scratch), which
    vLLM shares with the target; a drafter started from a backbone has its own (vocabulary-aligned)."""
    return init_of(config) == "scratch"


def _check_convert(config: Any) -> None:
    if config.target is None or config.store is None:
        raise ConfigError("convert --arch dflash needs both --target MODEL and --store STORE")
    if config.draft_vocab_size is not None:
        raise ConfigError("convert --arch dflash: --draft-vocab does not apply; the drafter drafts over the "
                          "full target vocabulary")


def _check_export(config: Any, fmt: str) -> None:
    # vLLM and SGLang both run the same DFlashDraftModel layout: Qwen3 layers (per-head q/k norms); the
    # embedding and head are the target's unless the export carries its own (a backbone's)
    engine = {"vllm": "vLLM", "sglang": "SGLang"}.get(fmt)
    if engine is not None and not config.qk_norm:
        raise ConfigError(f"export --format {fmt}: this dflash drafter was started from a Llama backbone and has no "
                          f"per-head q/k norms, which {engine}'s DFlashDraftModel always applies, so {engine} would "
                          "compute another model; convert it with --arch-option add_qk_norm=true to serve it there; "
                          "`osprey eval live` serves it as it is, and --format hf writes it")


SPEC = DrafterSpec(
    name="dflash",
    listing_order=3,
    summary="a DFlash block drafter: one forward drafts a block from the target's taps (needs --target and --store)",
    model_class="osprey_train.drafters.dflash.model:DFlashDrafter",
    convert="osprey_train.drafters.dflash.convert:convert_dflash",
    needs_backbone=False,
    accepts_backbone=True,
    reduced_draft_vocab=False,
    study_layer_cost=0.5,
    tiny={"family": "qwen3", "qk_norm": True, "num_layers": 1, "draft_vocab_size": 384,
          "arch_options": {"block_size": 4, "mask_token_id": 3}},
    arch_option_keys=OPTION_KEYS,
    check_config=_check_config,
    check_convert=_check_convert,
    check_export=_check_export,
    vllm_writer="osprey_train.drafters.dflash.export:write_dflash_vllm",
    vllm_reader="osprey_train.drafters.dflash.export:read_dflash_vllm",
    vllm_method="dflash",
    serving_label="DFlash (`DFlashDraftModel`, vLLM's and SGLang's own class)",
    objective="osprey_train.drafters.dflash.objective:DFlashObjective.from_config",
    offline_drafts="osprey_train.drafters.dflash.drafting:draft_all_positions",
    live_session="osprey_train.drafters.dflash.drafting:DFlashSession",
    tree_drafting=False,
    sampled_acceptance=False,
    sglang_architecture=VLLM_ARCHITECTURE,
    sglang_algorithm="DFLASH",
    sglang_writer="osprey_train.drafters.dflash.export:write_dflash_sglang",
    sglang_loader="osprey_train.drafters.dflash.export:read_dflash_sglang",
)

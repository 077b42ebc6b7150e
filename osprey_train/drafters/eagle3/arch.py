"""Registry entry of the EAGLE-3 baseline: one Llama layer reading [embedding; fused taps].

Torch-free (read by the CLI, configs and the study). Its code is in this folder: ``model.py``,
``convert.py`` (Stage 3), ``export.py`` (the vLLM speculators layout, the SGLang read-back).
"""

from __future__ import annotations

from typing import Any

from osprey_data.errors import ConfigError
from osprey_train.drafters.spec import DrafterSpec, no_arch_options

__all__ = ["SPEC", "SGLANG_ARCHITECTURE", "NUM_TAPS", "DEFAULT_DRAFT_VOCAB"]

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
"""SGLang's stock EAGLE-3 draft model class."""
NUM_TAPS = 3
"""SGLang's LlamaForCausalLMEagle3 sizes fc as 3 x target hidden; vLLM's EAGLE-3 expects 3 aux states."""
DEFAULT_DRAFT_VOCAB = 32000
"""Draft vocabulary size when --draft-vocab is not given (EAGLE-3's usual 32k)."""


def _check_config(config: Any) -> None:
    no_arch_options(config)
    if config.family != "llama" or config.qk_norm:
        raise ConfigError("drafter config: eagle3 uses a Llama-style layer (family 'llama', no qk_norm)")


def _check_convert(config: Any) -> None:
    if config.target is None or config.store is None:
        raise ConfigError("convert --arch eagle3 needs both --target MODEL and --store STORE")


def _check_export(config: Any, fmt: str) -> None:
    """The engines' EAGLE-3 classes read exactly 3 taps; SGLang's runs one layer, vLLM 0.32's any
    number (``num_hidden_layers``); --format hf takes any."""
    if fmt == "hf":
        return
    if fmt == "sglang" and config.num_layers != 1:
        raise ConfigError(f"export --format {fmt}: this EAGLE-3 drafter has {config.num_layers} layers; SGLang's "
                          "EAGLE-3 model runs exactly one (the multi-layer drafter is a study control); export it "
                          "with --format vllm (vLLM runs several) or --format hf")
    if config.num_taps != NUM_TAPS:
        raise ConfigError(f"export --format {fmt}: the EAGLE-3 drafter taps {config.num_taps} target layers "
                          f"({list(config.tap_layers.layer_ids)}); the engines' EAGLE-3 models read exactly "
                          f"{NUM_TAPS} (fc is sized 3 x target hidden): convert it again from a store "
                          f"built with 3 --layers")


SPEC = DrafterSpec(
    name="eagle3",
    listing_order=1,
    summary="a fresh EAGLE-3 baseline head shaped like the target (needs --target and --store)",
    model_class="osprey_train.drafters.eagle3.model:Eagle3Drafter",
    convert="osprey_train.drafters.eagle3.convert:convert_eagle3",
    needs_backbone=False,
    default_draft_vocab=DEFAULT_DRAFT_VOCAB,
    study_layer_cost=0.5,
    tiny={"num_layers": 1, "draft_vocab_size": 128},
    check_config=_check_config,
    check_convert=_check_convert,
    check_export=_check_export,
    vllm_writer="osprey_train.drafters.eagle3.export:write_eagle3_vllm",
    sglang_architecture=SGLANG_ARCHITECTURE,
    vllm_reader="osprey_train.drafters.eagle3.export:read_eagle3_vllm",
    sglang_reader="osprey_train.drafters.eagle3.export:eagle3_config_from_sglang",
    serving_label="EAGLE-3 (stock class)",
)

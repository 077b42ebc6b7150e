"""The target model: its identity, the layers tapped from it, loading it, and drafter compatibility.

Everything about the model a drafter serves lives here, below both the builder (which runs the
target) and the trainer (which converts, distills, evaluates and exports drafters for it)::

    TargetIdentity, identify_target      which target, by config and tokenizer hash
    TapLayers, default_tap_layers        tapped hidden states, with the SGLang / vLLM numbering
    load_hf_target, resolve_device       loading with transformers, device choice
    check_device                         a --device spelling, checked without torch
    peek_model_config, ModelShape        sizes from config.json / a GGUF header, before any load
    resolve_precision, Precision         float32 / bf16 weights / bf16 autocast, by CPU capability
    check_compatible                     a drafter against a store's or a live target
    check_fits_target_config             the same against a target's config.json, before loading
    TapCapture, decoder_layers           tapped hidden states taken with hooks during a forward
"""

from __future__ import annotations

from osprey_data.target_model.compat import DrafterTargetSpec, TargetSizes, check_compatible, check_fits_target_config
from osprey_data.target_model.identity import (TargetIdentity, chat_template_hash, config_hash, identify_target,
                                         text_config, tokenizer_hash)
from osprey_data.target_model.loading import (DEVICE_FORMS, check_device, check_target_exists, load_hf_target,
                                              resolve_device, split_gguf)
from osprey_data.target_model.model_config import (ModelShape, check_chat_template, has_chat_template,
                                                   peek_model_config)
from osprey_data.target_model.precision import (PRECISIONS, TRAIN_PRECISIONS, Precision, cpu_bf16_capable,
                                                prepack_linears, resolve_precision)
from osprey_data.target_model.tap_capture import TapCapture, decoder_layers
from osprey_data.target_model.taps import TAP_CONVENTIONS, TapLayers, default_tap_layers, parse_taps

__all__ = [
    "TargetIdentity", "identify_target", "config_hash", "tokenizer_hash", "chat_template_hash", "text_config",
    "TapLayers", "TAP_CONVENTIONS", "default_tap_layers", "parse_taps",
    "load_hf_target", "resolve_device", "check_device", "DEVICE_FORMS", "split_gguf", "check_target_exists",
    "ModelShape", "peek_model_config", "has_chat_template", "check_chat_template",
    "check_compatible", "check_fits_target_config", "DrafterTargetSpec", "TargetSizes", "TapCapture", "decoder_layers",
    "PRECISIONS", "TRAIN_PRECISIONS", "Precision", "cpu_bf16_capable", "prepack_linears", "resolve_precision",
]

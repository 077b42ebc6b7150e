"""The EAGLE-3 drafter's engine layouts: vLLM's speculators format, and the SGLang read-back.

``--format vllm`` writes the speculators EAGLE-3 layout, which vLLM 0.32 loads natively
(``speculative_config={"model": DIR, "method": "eagle3", ...}``; the keys it reads are listed in
:mod:`osprey_train.export.vllm`): ``speculators_model_type: eagle3`` with
``transformer_layer_config``, ``norm_before_residual: false`` (vLLM defaults it to true, while this
drafter keeps the un-normed hidden state as the residual), ``eagle_aux_hidden_state_layer_ids``
(HF hidden_states numbering, ascending) and ``speculators_config``. Tensor names: ``midlayer.`` is
vLLM's layer 0 and our ``layers.i`` its ``layers.{i+1}``; ``d2t`` as offsets only for a reduced
draft vocabulary. ``--format sglang`` uses the generic writer (SGLang's stock
``LlamaForCausalLMEagle3``); :func:`eagle3_config_from_sglang` reads it back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from osprey_data.errors import CheckpointError
from osprey_data.target_model import TapLayers, TargetIdentity
from osprey_train.export.common import cast_floating, offset_d2t, t2d_mask
from osprey_train.export.sglang import llama_layer_config
from osprey_train.export.vllm import vllm_readme, write_vllm_folder
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig

__all__ = ["write_eagle3_vllm", "read_eagle3_vllm", "eagle3_vllm_name", "eagle3_config_from_llama",
           "eagle3_config_from_sglang", "SPECULATORS_VERSION", "SPECULATORS_MODEL_TYPE"]

SPECULATORS_VERSION = "0.3.0"
SPECULATORS_MODEL_TYPE = "eagle3"
"""``speculators_model_type`` (and the algorithm) of the layout: the speculators EAGLE-3 model."""
# Target model_type -> HF architecture named in speculators_config.verifier (informational).
_VERIFIER_ARCH = {"llama": ["LlamaForCausalLM"], "qwen2": ["Qwen2ForCausalLM"], "qwen3": ["Qwen3ForCausalLM"],
                  "gemma3_text": ["Gemma3ForCausalLM"], "mistral": ["MistralForCausalLM"]}


def eagle3_vllm_name(name: str) -> str:
    """Our EAGLE-3 tensor name -> vLLM's: ``midlayer.`` is layer 0, our ``layers.i.`` layer i + 1."""
    if name.startswith("midlayer."):
        return "layers.0." + name[len("midlayer."):]
    if name.startswith("layers."):
        index, rest = name[len("layers."):].split(".", 1)
        return f"layers.{int(index) + 1}.{rest}"
    return name


def _our_eagle3_name(name: str) -> str:
    """Inverse of :func:`eagle3_vllm_name`."""
    if name.startswith("layers."):
        index, rest = name[len("layers."):].split(".", 1)
        return f"midlayer.{rest}" if int(index) == 0 else f"layers.{int(index) - 1}.{rest}"
    return name


def write_eagle3_vllm(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool,
                      speculative_tokens: int = 3) -> Path:
    """The speculators EAGLE-3 layout, which vLLM loads natively."""
    cfg = model.config
    target = cfg.target
    doc = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": SPECULATORS_MODEL_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": {**llama_layer_config(cfg, dtype), "architectures": ["LlamaForCausalLM"]},
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": cfg.tap_layers.to_vllm(),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": None if target is None else target.name_or_path,
                         "architectures": [] if target is None else _VERIFIER_ARCH.get(target.model_type, [])},
        },
        "torch_dtype": str(dtype).removeprefix("torch."),
        # provenance: which target (and tokenizer) this drafter serves
        "osprey_target": None if target is None else target.to_dict(),
    }
    state = cast_floating({eagle3_vllm_name(name): tensor for name, tensor in model.state_dict().items()
                           if name != "d2t"}, dtype)
    if cfg.draft_vocab_size != cfg.vocab_size:  # vLLM has a d2t parameter only for a reduced vocabulary
        state["d2t"] = offset_d2t(model.draft_to_target)
        state["t2d"] = t2d_mask(model.draft_to_target, cfg.vocab_size)
    # (a full draft vocabulary is the identity map: draft ids are sorted target ids)
    readme = vllm_readme(model, out, speculative_tokens=speculative_tokens)
    return write_vllm_folder(out, state, doc, source_dir, overwrite, readme)


def read_eagle3_vllm(doc: dict, raw: dict[str, torch.Tensor], where: Path) -> tuple[DrafterConfig, dict] | None:
    """(config, our state dict) of a speculators EAGLE-3 export; None when ``doc`` is another layout."""
    if doc.get("speculators_model_type") != SPECULATORS_MODEL_TYPE:
        return None
    try:
        config = eagle3_config_from_llama(
            doc["transformer_layer_config"], draft_vocab_size=doc["draft_vocab_size"],
            target_hidden_size=doc["target_hidden_size"],
            taps=TapLayers.from_vllm(doc["eagle_aux_hidden_state_layer_ids"]), target=doc.get("osprey_target"))
    except KeyError as exc:
        raise CheckpointError(f"{where}: lacks {exc}; not a speculators eagle3 checkpoint") from None
    return config, {_our_eagle3_name(k): v for k, v in raw.items() if k != "t2d"}


def eagle3_config_from_llama(layer: dict[str, Any], *, draft_vocab_size: int, target_hidden_size: int,
                             taps: TapLayers, target: dict | None) -> DrafterConfig:
    """Inverse of :func:`llama_layer_config` for an EAGLE-3 drafter (KeyError names a missing key)."""
    return DrafterConfig(
        arch="eagle3", family="llama", num_layers=layer.get("num_hidden_layers", 1), hidden_size=layer["hidden_size"],
        intermediate_size=layer["intermediate_size"], num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer["num_key_value_heads"], head_dim=layer["head_dim"],
        rms_norm_eps=layer["rms_norm_eps"], rope_theta=layer["rope_theta"], rope_scaling=layer.get("rope_scaling"),
        max_position_embeddings=layer["max_position_embeddings"], vocab_size=layer["vocab_size"],
        draft_vocab_size=draft_vocab_size, target_hidden_size=target_hidden_size, tap_layers=taps,
        target=None if target is None else TargetIdentity.from_dict(target),
    )


def eagle3_config_from_sglang(doc: dict, where: Path) -> DrafterConfig:
    """The EAGLE-3 drafter's config from a LlamaForCausalLMEagle3 config.json."""
    try:
        return eagle3_config_from_llama(
            doc, draft_vocab_size=doc["draft_vocab_size"], target_hidden_size=doc["target_hidden_size"],
            taps=TapLayers.from_sglang(doc["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
            target=doc.get("osprey_target"))
    except KeyError as exc:
        raise CheckpointError(f"{where}: config.json lacks {exc}; not an EAGLE-3 SGLang checkpoint") from None

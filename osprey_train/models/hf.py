"""Mapping between HF source checkpoints (Llama / Qwen2 / Qwen3) and the drafters' layers.

Stage 3 reads a pruned/pre-trained HF model and needs (a) a DrafterConfig describing the same
decoder layers and (b) the tensors copied 1:1 into the drafter (q/k/v into the first column
block). Both live here so that convert, export and the tests use one mapping.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from osprey_data.errors import ModelError
from osprey_train.models.config import DrafterConfig

__all__ = ["FAMILY_OF_MODEL_TYPE", "hf_family", "hf_rope", "drafter_config_from_hf", "copy_backbone_layers"]

# HF model_type -> drafter family (same layer arithmetic and parameter names).
FAMILY_OF_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

# Per-layer tensors copied verbatim (name relative to model.layers.i.).
_PLAIN_LAYER_TENSORS = (
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.o_proj.weight", "self_attn.o_proj.bias",
    "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)
# Tensors whose first column block receives the source tensor (the rest reads the condition).
_WIDENED_LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")


def hf_family(hf_config: Any, *, where: str) -> str:
    """The drafter family of an HF config, or a ModelError naming what is supported."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILY_OF_MODEL_TYPE:
        raise ModelError(
            f"{where}: model_type {model_type!r} cannot be an Osprey drafter body; supported source "
            f"families: {sorted(FAMILY_OF_MODEL_TYPE)} (prune/pretrain one of those)"
        )
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"{where}: hidden_act {act!r} is not supported (SwiGLU with silu only)")
    if getattr(hf_config, "mlp_bias", False):
        raise ModelError(f"{where}: mlp_bias=True is not supported")
    layer_types = getattr(hf_config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(hf_config, "use_sliding_window", False):
        raise ModelError(f"{where}: sliding-window layers are not supported; use full attention layers")
    return FAMILY_OF_MODEL_TYPE[model_type]


def hf_rope(hf_config: Any, *, where: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from a transformers 5 ``rope_parameters`` or 4.x config."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        if "rope_theta" not in params:
            raise ModelError(f"{where}: per-layer-type rope parameters are not supported ({sorted(params)})")
        rope_type = params.get("rope_type", "default")
        scaling = None if rope_type == "default" else {
            k: v for k, v in params.items() if k != "rope_theta"
        }
        return float(params["rope_theta"]), scaling
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(getattr(hf_config, "rope_theta", 10000.0)), (dict(scaling) if scaling else None)


def drafter_config_from_hf(hf_config: Any, *, where: str, **fields: Any) -> DrafterConfig:
    """A DrafterConfig with the source's layer shapes; target-side fields come from ``fields``."""
    family = hf_family(hf_config, where=where)
    theta, scaling = hf_rope(hf_config, where=where)
    heads = hf_config.num_attention_heads
    base = dict(
        arch="osprey", family=family, num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size, intermediate_size=hf_config.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        rms_norm_eps=float(hf_config.rms_norm_eps), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=hf_config.max_position_embeddings,
        attention_bias=bool(getattr(hf_config, "attention_bias", False)) if family != "qwen2" else False,
        qk_norm=family == "qwen3",
    )
    base.update(fields)
    return DrafterConfig(**base)


@torch.no_grad()
def copy_backbone_layers(layers: Any, hf_state: Mapping[str, torch.Tensor], *, prefix: str = "model.layers",
                         where: str, not_in_source: tuple[str, ...] = ()) -> None:
    """Copy each source layer's tensors into ``layers`` (a ModuleList of drafter layers).

    q/k/v weights go into columns [:D]; the extra columns are left as they are (convert zeroes
    them). A missing or mis-shaped source tensor is a ModelError naming it, except the layer
    tensors named in ``not_in_source``, which the caller sets itself.
    """
    for i, layer in enumerate(layers):
        own = dict(layer.named_parameters())
        for name in _PLAIN_LAYER_TENSORS + _WIDENED_LAYER_TENSORS:
            if name not in own or name in not_in_source:
                continue
            key = f"{prefix}.{i}.{name}"
            if key not in hf_state:
                raise ModelError(f"{where}: tensor {key} is missing from the source checkpoint")
            src, dst = hf_state[key], own[name]
            if name in _WIDENED_LAYER_TENSORS:
                width = src.shape[1]
                if dst.shape[0] != src.shape[0] or dst.shape[1] < width:
                    raise ModelError(f"{where}: {key} has shape {tuple(src.shape)}, drafter expects "
                                     f"({dst.shape[0]}, <= {dst.shape[1]})")
                dst[:, :width].copy_(src.to(dst.dtype))
            else:
                if tuple(src.shape) != tuple(dst.shape):
                    raise ModelError(f"{where}: {key} has shape {tuple(src.shape)}, drafter expects {tuple(dst.shape)}")
                dst.copy_(src.to(dst.dtype))

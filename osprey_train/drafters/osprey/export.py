"""The Osprey drafter's engine layouts: vLLM (this package's own model class) and the SGLang read-back.

``--format vllm`` writes ``architectures: [Eagle3OspreyForCausalLM]``, a LlamaConfig
(``model_type: llama``) describing its layers plus ``target_hidden_size``, ``draft_vocab_size``,
``eagle_aux_hidden_state_layer_ids`` and the DrafterConfig under ``osprey_drafter``; tensors under
the drafter's own names (``model.layers.i.*``, ``w_c.weight``, ...), with ``d2t`` / ``t2d`` for a
reduced draft vocabulary. vLLM has no such class of its own: this package registers one
(:mod:`osprey_train.drafters.osprey.vllm_model`) through vLLM's plugin entry point, so the folder
loads wherever this package is installed next to vLLM. Llama and Qwen2 families; Qwen3 (q/k norms)
is refused by the arch's export check. ``--format sglang`` uses the generic writer with the
DrafterConfig under ``osprey_drafter``, served by the external class in
:mod:`osprey_train.drafters.osprey.sglang.model`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from osprey_data.errors import CheckpointError
from osprey_train.drafters.osprey.arch import VLLM_ARCHITECTURE, VLLM_FAMILIES
from osprey_train.export.common import cast_floating, offset_d2t, t2d_mask
from osprey_train.export.sglang import llama_layer_config
from osprey_train.export.vllm import vllm_readme, write_vllm_folder
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig

__all__ = ["write_osprey_vllm", "read_osprey_vllm", "osprey_config_from_sglang"]


def write_osprey_vllm(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool,
                      speculative_tokens: int = 3) -> Path:
    """The Osprey layout served by this package's vLLM model class (``speculative_tokens`` is the
    serving command's choice there: vLLM reads no proposal method from this config)."""
    cfg = model.config
    assert cfg.family in VLLM_FAMILIES, "check_export refuses the other families"
    doc = {**llama_layer_config(cfg, dtype), "architectures": [VLLM_ARCHITECTURE],
           "target_hidden_size": cfg.target_hidden_size, "draft_vocab_size": cfg.draft_vocab_size,
           "eagle_aux_hidden_state_layer_ids": cfg.tap_layers.to_vllm(), "osprey_drafter": cfg.to_dict(),
           "osprey_target": None if cfg.target is None else cfg.target.to_dict()}
    state = cast_floating({name: tensor for name, tensor in model.state_dict().items() if name != "d2t"}, dtype)
    if model.draft_to_target is not None:
        state["d2t"] = offset_d2t(model.draft_to_target)
        state["t2d"] = t2d_mask(model.draft_to_target, cfg.vocab_size)
    readme = vllm_readme(model, out, speculative_tokens=speculative_tokens, plugin=True)
    return write_vllm_folder(out, state, doc, source_dir, overwrite, readme)


def read_osprey_vllm(doc: dict, raw: dict[str, torch.Tensor], where: Path) -> tuple[DrafterConfig, dict] | None:
    """(config, state dict) of an Osprey vLLM export; None when ``doc`` is another layout."""
    if (doc.get("architectures") or [None])[0] != VLLM_ARCHITECTURE:
        return None
    if "osprey_drafter" not in doc:
        raise CheckpointError(f"{where}: lacks osprey_drafter; not an Osprey vLLM export")
    return DrafterConfig.from_dict(doc["osprey_drafter"]), {k: v for k, v in raw.items() if k != "t2d"}


def osprey_config_from_sglang(doc: dict, where: Path) -> DrafterConfig:
    """The Osprey drafter's config from its SGLang config.json (it travels whole under ``osprey_drafter``)."""
    if "osprey_drafter" not in doc:
        raise CheckpointError(f"{where}: config.json lacks 'osprey_drafter'; not an Osprey SGLang export")
    return DrafterConfig.from_dict(doc["osprey_drafter"])

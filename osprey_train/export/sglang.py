"""``--format sglang``: checkpoints SGLang loads as the draft model of ``--speculative-algorithm EAGLE3``.

EAGLE-3 baseline -> SGLang's stock ``LlamaForCausalLMEagle3`` (python/sglang/srt/models/llama_eagle3.py):

- tensors ``embed_tokens.weight``, ``fc.weight`` (Linear(3*Dt -> D)), ``midlayer.*`` (q/k/v_proj with
  2D inputs [norm(embed); norm(hidden)], o_proj, gate/up/down_proj, input_layernorm, hidden_norm,
  post_attention_layernorm), ``norm.weight``, ``lm_head.weight`` (Vd rows), ``d2t`` (int64 OFFSETS:
  SGLang's loader sets ``hot_token_id = d2t + arange(Vd)``, i.e. target_id = draft_id + d2t[draft_id]),
  ``t2d`` (bool (V,), ignored by SGLang, kept for other tools);
- config: a LlamaConfig (``model_type: llama``, ``architectures: [LlamaForCausalLMEagle3]``,
  ``num_hidden_layers: 1``, ``vocab_size`` = target vocab, ``tie_word_embeddings: false``) plus
  ``draft_vocab_size``, ``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``
  in SGLang's convention (SGLang adds 1 and captures the input of that layer, so id j = output of
  decoder layer j = HF hidden_states[j+1]; ``TapLayers.to_sglang``).

Osprey drafter -> the same kind of folder with ``architectures: [OspreyDrafterForCausalLM]``, served
by the external model class in ``osprey_train/drafters/osprey/sglang/model.py`` (set
``SGLANG_EXTERNAL_MODEL_PACKAGE=osprey_train.drafters.osprey.sglang``). Tensor names are the Osprey drafter's own
(``model.layers.i.*``, ``w_c.weight``, ...); the DrafterConfig travels under ``osprey_drafter``.
With a reduced draft vocabulary, ``d2t`` / ``t2d`` are written as for EAGLE-3 (offsets; the class
turns them into SGLang's ``hot_token_id``).

DFlash drafter -> SGLang's own ``DFlashDraftModel`` (``--speculative-algorithm DFLASH``): the arch's
own writer (its spec's ``sglang_writer``, :mod:`osprey_train.drafters.dflash.export`), the layout vLLM
reads as well.

All come with ``serving.json`` and ``README.md``: the recommended ``--speculative-*`` flags
(:mod:`osprey_train.export.serving`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from osprey_data.atomic import write_json, write_text
from osprey_data.errors import CheckpointError, ConfigError
from osprey_train.drafters.registry import DRAFTERS, drafter_spec, spec_for_sglang_architecture
from osprey_train.export.common import (
    absolute_d2t,
    cast_floating,
    copy_side_files,
    dtype_name,
    load_tensors,
    offset_d2t,
    read_json,
    save_tensors,
    t2d_mask,
    write_folder,
)
from osprey_train.export.serving import ServingRecommendation, recommend, serving_doc, serving_readme
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.io import build_drafter

__all__ = ["write_sglang", "read_sglang", "llama_layer_config", "write_sglang_folder"]

WEIGHTS = "model.safetensors"


def llama_layer_config(cfg: DrafterConfig, dtype: torch.dtype) -> dict[str, Any]:
    """HF LlamaConfig keys describing the drafter's layers (transformers 4.x style rope keys)."""
    doc = {
        "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling, "attention_bias": cfg.attention_bias,
        "mlp_bias": False, "vocab_size": cfg.vocab_size, "tie_word_embeddings": False,
        "torch_dtype": dtype_name(dtype),
    }
    return doc


def _engine_state(model: Drafter, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors in ``dtype``; a draft vocabulary as the engines' int64 d2t offsets + t2d mask."""
    state = cast_floating({k: v for k, v in model.state_dict().items() if k != "d2t"}, dtype)
    if model.draft_to_target is not None:
        state["d2t"] = offset_d2t(model.draft_to_target)
        state["t2d"] = t2d_mask(model.draft_to_target, model.config.vocab_size)
    return state


def write_sglang(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None,
                 overwrite: bool, serving: ServingRecommendation | None = None) -> Path:
    """Write ``model`` in the layout SGLang loads (see module docstring), with ``serving.json`` and
    ``README.md`` (:mod:`serving`: ``serving`` or the untuned default)."""
    cfg = model.config
    spec = drafter_spec(cfg.arch)
    spec.check_export(cfg, "sglang")
    if spec.sglang_writer is not None:   # the arch's own layout (dflash: SGLang's DFlashDraftModel)
        return spec.load("sglang_writer")(model, out, dtype=dtype, source_dir=source_dir, overwrite=overwrite,
                                          serving=serving)
    if spec.sglang_architecture is None:   # a spec that lets sglang through must name the class
        raise ConfigError(f"export --format sglang: SGLang has no model class for the {cfg.arch!r} drafter; "
                          "use --format hf")
    doc = llama_layer_config(cfg, dtype)
    doc["target_hidden_size"] = cfg.target_hidden_size
    doc["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": cfg.tap_layers.to_sglang(),
                           "use_aux_hidden_state": True}
    # provenance: which target (and tokenizer) this drafter serves
    doc["osprey_target"] = None if cfg.target is None else cfg.target.to_dict()
    doc.update(architectures=[spec.sglang_architecture], draft_vocab_size=cfg.draft_vocab_size,
               **spec.sglang_fields(cfg))
    state = _engine_state(model, dtype)

    served = serving_doc(serving or recommend(None), export_dir=out, arch=cfg.arch,
                         target=None if cfg.target is None else cfg.target.name_or_path, dtype=dtype_name(dtype))

    return write_sglang_folder(out, state, doc, served, source_dir=source_dir, overwrite=overwrite)


def write_sglang_folder(out: Path, state: dict[str, torch.Tensor], doc: dict[str, Any], served: dict[str, Any], *,
                        source_dir: Path | None, overwrite: bool) -> Path:
    """Tensors, ``config.json`` = ``doc``, the side files, ``serving.json`` = ``served`` and its README, atomically."""
    def fill(tmp: Path) -> None:
        save_tensors(state, tmp / WEIGHTS)
        write_json(tmp / "config.json", doc)
        copy_side_files(source_dir, tmp)
        write_json(tmp / "serving.json", served)
        write_text(tmp / "README.md", serving_readme(served))

    return write_folder(out, fill, overwrite=overwrite)


def read_sglang(path: Path) -> Drafter:
    """Load an SGLang-layout export back into an Osprey drafter object (for checks / round trips)."""
    path = Path(path)
    doc = read_json(path / "config.json")
    spec = spec_for_sglang_architecture((doc.get("architectures") or [None])[0])
    if spec is not None and spec.sglang_loader is not None:
        return spec.load("sglang_loader")(path)
    if spec is None or spec.sglang_reader is None:
        known = " or ".join(s.sglang_architecture for s in DRAFTERS.values() if s.sglang_reader)
        raise CheckpointError(f"{path / 'config.json'}: architectures {doc.get('architectures')} is not an "
                              f"Osprey SGLang export ({known})")
    config = spec.load("sglang_reader")(doc, path / "config.json")
    state = load_tensors(path / WEIGHTS)
    if "d2t" in state:
        state["d2t"] = absolute_d2t(state["d2t"])
        state.pop("t2d", None)
    model = build_drafter(config)
    dtype = next(v.dtype for k, v in state.items() if v.is_floating_point())
    model.to(dtype)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{path / WEIGHTS}: tensors do not match config.json: {exc}") from None
    return model.eval()

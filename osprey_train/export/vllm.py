"""``--format vllm``: the EAGLE-3 baseline in the speculators format vLLM loads natively.

vLLM (``vllm serve TARGET --speculative-config '{"model": DIR, ...}'``, or ``vllm serve DIR``)
recognises ``speculators_model_type: eagle3`` and builds ``Eagle3LlamaForCausalLM`` from
``transformer_layer_config`` plus the top-level keys (vllm/transformers_utils/configs/speculators):

- ``draft_vocab_size``, ``target_hidden_size``;
- ``norm_before_residual: false`` — must be explicit: vLLM defaults it to TRUE when absent, while
  this drafter keeps the un-normed hidden state as the residual (EAGLE-3 / SGLang semantics);
- ``eagle_aux_hidden_state_layer_ids`` in vLLM's convention: vLLM captures ``hidden + residual``
  BEFORE running layer idx, i.e. HF hidden_states[idx]: the same numbers as Osprey's taps;
- ``speculators_config``: algorithm, proposal_methods (greedy, ``speculative_tokens``), verifier.

Tensors: ``embed_tokens.weight``, ``fc.weight``, ``layers.0.*`` (speculators naming of the single
layer), ``norm.weight``, ``lm_head.weight``, ``d2t`` (int64 offsets: vLLM computes
``targets = arange(Vd) + d2t``), ``t2d`` (bool (V,), skipped by vLLM).

The Osprey drafter (N conditioned layers) has no vLLM implementation; exporting it to vllm is a
ConfigError pointing to ``--format sglang`` / ``hf``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from osprey_data.atomic import write_json
from osprey_data.errors import CheckpointError, ConfigError
from osprey_data.target_model import TapLayers
from osprey_train.drafters.registry import drafter_spec
from osprey_train.export.common import (absolute_d2t, copy_side_files, load_tensors, offset_d2t, read_json,
                                        save_tensors, t2d_mask, write_folder)
from osprey_train.export.sglang import eagle3_config_from_llama, llama_layer_config
from osprey_train.models.base import Drafter
from osprey_train.models.io import build_drafter

__all__ = ["write_vllm", "read_vllm", "SPECULATORS_VERSION"]

SPECULATORS_VERSION = "0.3.0"
SPECULATORS_MODEL_TYPE = "eagle3"
"""``speculators_model_type`` (and the algorithm) of the layout: the speculators EAGLE-3 model."""
# Target model_type -> HF architecture named in speculators_config.verifier (informational).
_VERIFIER_ARCH = {"llama": ["LlamaForCausalLM"], "qwen2": ["Qwen2ForCausalLM"], "qwen3": ["Qwen3ForCausalLM"],
                  "gemma3_text": ["Gemma3ForCausalLM"], "mistral": ["MistralForCausalLM"]}
WEIGHTS = "model.safetensors"


def write_vllm(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool,
               speculative_tokens: int = 3) -> Path:
    """Write the EAGLE-3 drafter ``model`` in speculators format."""
    cfg = model.config
    drafter_spec(cfg.arch).check_export(cfg, "vllm")   # refuses the archs vLLM has no class for
    if cfg.target_hidden_size != cfg.hidden_size:
        raise ConfigError(f"export --format vllm: the drafter's hidden size {cfg.hidden_size} differs from the "
                          f"target's {cfg.target_hidden_size}; vLLM's EAGLE-3 loader sizes fc as 3 x the drafter "
                          "hidden size and refuses target_hidden_size != hidden_size, so this checkpoint could "
                          "not be served there (use --format sglang, or a drafter as wide as the target)")
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
            "algorithm": SPECULATORS_MODEL_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": None if target is None else target.name_or_path,
                         "architectures": [] if target is None else _VERIFIER_ARCH.get(target.model_type, [])},
        },
        "torch_dtype": str(dtype).removeprefix("torch."),
        # provenance: which target (and tokenizer) this drafter serves
        "osprey_target": None if target is None else target.to_dict(),
    }
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "d2t":
            continue
        state[name.replace("midlayer.", "layers.0.", 1)] = tensor.to(dtype)
    state["d2t"] = offset_d2t(model.draft_to_target)
    state["t2d"] = t2d_mask(model.draft_to_target, cfg.vocab_size)

    def fill(tmp: Path) -> None:
        save_tensors(state, tmp / WEIGHTS)
        write_json(tmp / "config.json", doc)
        copy_side_files(source_dir, tmp)

    return write_folder(out, fill, overwrite=overwrite)


def read_vllm(path: Path) -> Drafter:
    """Load a speculators-format EAGLE-3 export back into an Eagle3Drafter."""
    path = Path(path)
    doc = read_json(path / "config.json")
    if doc.get("speculators_model_type") != SPECULATORS_MODEL_TYPE:
        raise CheckpointError(f"{path / 'config.json'}: not a speculators eagle3 checkpoint")
    try:
        config = eagle3_config_from_llama(
            doc["transformer_layer_config"], draft_vocab_size=doc["draft_vocab_size"],
            target_hidden_size=doc["target_hidden_size"],
            taps=TapLayers.from_vllm(doc["eagle_aux_hidden_state_layer_ids"]), target=doc.get("osprey_target"))
    except KeyError as exc:
        raise CheckpointError(f"{path / 'config.json'}: lacks {exc}; not a speculators eagle3 checkpoint") from None
    raw = load_tensors(path / WEIGHTS)
    state = {k.replace("layers.0.", "midlayer.", 1): v for k, v in raw.items() if k != "t2d"}
    state["d2t"] = absolute_d2t(state["d2t"])
    model = build_drafter(config)
    model.to(next(v.dtype for v in state.values() if v.is_floating_point()))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{path / WEIGHTS}: tensors do not match config.json: {exc}") from None
    return model.eval()

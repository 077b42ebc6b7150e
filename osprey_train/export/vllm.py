"""``--format vllm``: drafters in the layout vLLM 0.32 loads as EAGLE-3 draft models.

EAGLE-3 baseline -> the speculators format vLLM loads natively. vLLM (``LLM(TARGET,
speculative_config={"model": DIR, "method": "eagle3", ...})``) recognises
``speculators_model_type: eagle3`` and builds ``Eagle3LlamaForCausalLM`` from
``transformer_layer_config`` plus the top-level keys (vllm/transformers_utils/configs/speculators):

- ``draft_vocab_size``, ``target_hidden_size``;
- ``norm_before_residual: false`` — must be explicit: vLLM defaults it to TRUE when absent, while
  this drafter keeps the un-normed hidden state as the residual (EAGLE-3 / SGLang semantics);
- ``eagle_aux_hidden_state_layer_ids`` in vLLM's convention: vLLM captures ``hidden + residual``
  BEFORE running layer idx, i.e. HF hidden_states[idx]: the same numbers as Osprey's taps. vLLM
  sorts these ids and concatenates the taps in ascending layer order, whatever order the list has
  (``_set_aux_hidden_state_layers``); Osprey's taps are ascending by construction;
- ``speculators_config``: algorithm, proposal_methods (greedy, ``speculative_tokens``), verifier.

Tensors: ``embed_tokens.weight``, ``fc.weight``, ``layers.N.*`` (``midlayer.`` is layer 0; the
extra plain layers of a multi-layer drafter, ours ``layers.i``, are vLLM's ``layers.{i+1}``: vLLM
0.32 runs ``num_hidden_layers`` layers, layer 0 reading [embedding ; condition], the others the
residual stream), ``norm.weight``, ``lm_head.weight``, ``d2t`` (int64 offsets: vLLM computes
``targets = arange(Vd) + d2t``; absent when the draft vocabulary is the whole target vocabulary,
where vLLM has no such parameter), ``t2d`` (bool (V,), skipped by vLLM).

vLLM 0.32 sizes ``fc`` from ``target_hidden_size`` (``3 x Dt -> D``) and keeps a drafter's own
embedding when its width differs from the target's, so a drafter narrower than its target is
served as it is (older vLLM releases sized ``fc`` as ``3 x D``; this export targets 0.32).

Osprey drafter -> ``architectures: [Eagle3OspreyForCausalLM]``, a LlamaConfig (``model_type:
llama``) describing its layers plus ``target_hidden_size``, ``draft_vocab_size``,
``eagle_aux_hidden_state_layer_ids`` and the DrafterConfig under ``osprey_drafter``; tensors under
the drafter's own names (``model.layers.i.*``, ``w_c.weight``, ...), with ``d2t`` / ``t2d`` for a
reduced draft vocabulary. vLLM has no such class of its own: this package registers one
(:mod:`osprey_train.engines.vllm_osprey`) through vLLM's plugin entry point, so the folder loads
wherever this package is installed next to vLLM. Llama and Qwen2 families; Qwen3 (q/k norms) is
refused.

Both layouts come with a ``README.md`` holding the ``vllm serve`` launch line (:func:`vllm_readme`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch

from osprey_data.atomic import write_json, write_text
from osprey_data.errors import CheckpointError
from osprey_data.target_model import TapLayers
from osprey_train.drafters.osprey import VLLM_FAMILIES as VLLM_OSPREY_FAMILIES
from osprey_train.drafters.registry import drafter_spec
from osprey_train.export.common import (absolute_d2t, cast_floating, copy_side_files, load_tensors, offset_d2t, read_json,
                                        save_tensors, t2d_mask, write_folder)
from osprey_train.export.sglang import eagle3_config_from_llama, llama_layer_config
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.io import build_drafter

__all__ = ["write_vllm", "write_eagle3_vllm", "write_osprey_vllm", "read_vllm", "SPECULATORS_VERSION",
           "SPECULATORS_MODEL_TYPE", "OSPREY_VLLM_ARCH", "VLLM_OSPREY_FAMILIES", "eagle3_vllm_name", "vllm_readme"]

SPECULATORS_VERSION = "0.3.0"
SPECULATORS_MODEL_TYPE = "eagle3"
"""``speculators_model_type`` (and the algorithm) of the layout: the speculators EAGLE-3 model."""
# Target model_type -> HF architecture named in speculators_config.verifier (informational).
_VERIFIER_ARCH = {"llama": ["LlamaForCausalLM"], "qwen2": ["Qwen2ForCausalLM"], "qwen3": ["Qwen3ForCausalLM"],
                  "gemma3_text": ["Gemma3ForCausalLM"], "mistral": ["MistralForCausalLM"]}
WEIGHTS = "model.safetensors"
OSPREY_VLLM_ARCH = "Eagle3OspreyForCausalLM"
"""Registered with vLLM by osprey_train.engines.vllm_plugin (vLLM keeps names starting with Eagle3)."""


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


def write_vllm(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool,
               speculative_tokens: int = 3) -> Path:
    """Write ``model`` in the layout vLLM loads (see the module docstring): the arch's ``vllm_writer``."""
    spec = drafter_spec(model.config.arch)
    spec.check_export(model.config, "vllm")   # refuses what vLLM cannot serve, with the arch's reason
    writer = spec.load("vllm_writer")
    return writer(model, out, dtype=dtype, source_dir=source_dir, overwrite=overwrite,
                  speculative_tokens=speculative_tokens)


def vllm_readme(model: Drafter, export_dir: Path, *, speculative_tokens: int = 3, plugin: bool = False) -> str:
    """The README of a vLLM export: the ``vllm serve`` line (and with ``plugin``, for a drafter served
    by this package's own model class, the install step it needs: this package next to vLLM)."""
    cfg = model.config
    target = "TARGET" if cfg.target is None or not cfg.target.name_or_path else cfg.target.name_or_path
    spec = json.dumps({"model": str(Path(export_dir).resolve()), "method": "eagle3",
                       "num_speculative_tokens": speculative_tokens})
    install = ""
    if plugin:
        install = ("# vLLM serves this drafter with Osprey's own model class, registered through the vLLM plugin\n"
                   "# entry point: install Osprey into vLLM's environment (not from PyPI, where `osprey` is another\n"
                   "# project), from a clone of the Osprey repository:\npip install -e .\n")
    return "\n".join([
        "# Serving this drafter with vLLM", "",
        f"Architecture: {drafter_spec(cfg.arch).serving_label}; target: `{target}`.", "",
        "```bash", f"{install}vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(spec)}", "```", "",
        f"`num_speculative_tokens` is the chain's draft length per verify round ({speculative_tokens} here); "
        "measure a few values on your hardware (`osprey eval engine`, `osprey eval sweep`).", ""])


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
    return _write(out, state, doc, source_dir, overwrite, readme)


def write_osprey_vllm(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool,
                      speculative_tokens: int = 3) -> Path:
    """The Osprey layout served by this package's vLLM model class (``speculative_tokens`` is the
    serving command's choice there: vLLM reads no proposal method from this config)."""
    cfg = model.config
    assert cfg.family in VLLM_OSPREY_FAMILIES, "check_export refuses the other families"
    doc = {**llama_layer_config(cfg, dtype), "architectures": [OSPREY_VLLM_ARCH],
           "target_hidden_size": cfg.target_hidden_size, "draft_vocab_size": cfg.draft_vocab_size,
           "eagle_aux_hidden_state_layer_ids": cfg.tap_layers.to_vllm(), "osprey_drafter": cfg.to_dict(),
           "osprey_target": None if cfg.target is None else cfg.target.to_dict()}
    state = cast_floating({name: tensor for name, tensor in model.state_dict().items() if name != "d2t"}, dtype)
    if model.draft_to_target is not None:
        state["d2t"] = offset_d2t(model.draft_to_target)
        state["t2d"] = t2d_mask(model.draft_to_target, cfg.vocab_size)
    readme = vllm_readme(model, out, speculative_tokens=speculative_tokens, plugin=True)
    return _write(out, state, doc, source_dir, overwrite, readme)


def _write(out: Path, state: dict, doc: dict, source_dir: Path | None, overwrite: bool, readme: str) -> Path:
    def fill(tmp: Path) -> None:
        save_tensors(state, tmp / WEIGHTS)
        write_json(tmp / "config.json", doc)
        copy_side_files(source_dir, tmp)
        write_text(tmp / "README.md", readme)

    return write_folder(out, fill, overwrite=overwrite)


def read_vllm(path: Path) -> Drafter:
    """Load a ``--format vllm`` export (EAGLE-3 speculators format or Osprey) back into a drafter."""
    path = Path(path)
    doc = read_json(path / "config.json")
    raw = load_tensors(path / WEIGHTS)
    if (doc.get("architectures") or [None])[0] == OSPREY_VLLM_ARCH:
        if "osprey_drafter" not in doc:
            raise CheckpointError(f"{path / 'config.json'}: lacks osprey_drafter; not an Osprey vLLM export")
        config = DrafterConfig.from_dict(doc["osprey_drafter"])
        state = {k: v for k, v in raw.items() if k != "t2d"}
    elif doc.get("speculators_model_type") == SPECULATORS_MODEL_TYPE:
        try:
            config = eagle3_config_from_llama(
                doc["transformer_layer_config"], draft_vocab_size=doc["draft_vocab_size"],
                target_hidden_size=doc["target_hidden_size"],
                taps=TapLayers.from_vllm(doc["eagle_aux_hidden_state_layer_ids"]), target=doc.get("osprey_target"))
        except KeyError as exc:
            raise CheckpointError(f"{path / 'config.json'}: lacks {exc}; not a speculators eagle3 checkpoint") from None
        state = {_our_eagle3_name(k): v for k, v in raw.items() if k != "t2d"}
    else:
        raise CheckpointError(f"{path / 'config.json'}: neither a speculators eagle3 checkpoint nor an Osprey "
                              f"vLLM export ({OSPREY_VLLM_ARCH})")
    if "d2t" in state:
        state["d2t"] = absolute_d2t(state["d2t"])
    model = build_drafter(config)
    model.to(next(v.dtype for v in state.values() if v.is_floating_point()))
    if "d2t" not in state and getattr(model, "draft_to_target", None) is not None:
        state["d2t"] = torch.arange(config.vocab_size)  # a full draft vocabulary: the identity map
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{path / WEIGHTS}: tensors do not match config.json: {exc}") from None
    return model.eval()

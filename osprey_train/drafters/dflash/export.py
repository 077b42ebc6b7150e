"""The DFlash drafter's engine layout: what vLLM 0.32 and SGLang load as ``DFlashDraftModel``, unchanged.

SGLang's ``models/dflash.py`` reads the same folder (``--speculative-algorithm DFLASH``; config via
``speculative/dflash_utils.parse_dflash_draft_config``: ``dflash_config.target_layer_ids`` in the
same decoder-layer-output convention, ``mask_token_id``, a top-level ``block_size``; tensors
``layers.*``, ``fc``, ``hidden_norm``, ``norm``, the embedding and head taken from the target), so
``--format sglang`` writes it again with ``serving.json`` and a README: SGLang verifies
``--speculative-num-draft-tokens`` = the block size per round and runs DFLASH on CUDA only.

What vLLM reads (``vllm/model_executor/models/qwen3_dflash.py``, ``v1/spec_decode/dflash.py``,
``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``), and what this writer puts there:

- ``architectures: ["DFlashDraftModel"]``, ``model_type: "qwen3"``, the Qwen3 shape fields,
  ``hidden_act: silu``, ``attention_bias: false``, the draft's own RoPE (``rope_theta`` and
  ``rope_parameters`` of the default type; vLLM's rotation is the neox half-split layout, which is
  what :mod:`osprey_train.models.layers` computes), ``target_hidden_size``;
- ``dflash_config.target_layer_ids``: 0-based decoder layers whose outputs are tapped; vLLM adds 1
  and captures HF ``hidden_states[id + 1]``, so they are our tap ids minus one (a tap of the
  embeddings, id 0, has no DFlash id and is refused); ``dflash_config.mask_token_id``;
  ``block_size`` (informational: vLLM drafts ``num_speculative_tokens`` per round, ``block_size - 1``
  matches training);
- tensors without a ``model.`` prefix: ``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and
  per layer ``layers.N.{input_layernorm,post_attention_layernorm}.weight``,
  ``layers.N.self_attn.{q,k,v,o}_proj.weight``, ``layers.N.self_attn.{q,k}_norm.weight``,
  ``layers.N.mlp.{gate,up,down}_proj.weight``. The embedding and the LM head of a drafter from
  scratch are the target's (frozen copies): the export leaves them out and vLLM shares the target's
  own, as it does for every DFlash draft that ships none. A drafter started from a backbone has its
  own (vocabulary-aligned, in the backbone's hidden size) and the export carries them as
  ``embed_tokens.weight`` and ``lm_head.weight``, which vLLM loads when present; so does a drafter
  whose target is unknown (no identity in its config), since there is no target to share with.

:func:`read_dflash_vllm` reads the layout back; where the export has no embedding and head it takes
them from the target folder the export names (``osprey_target.name_or_path``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from osprey_data.errors import CheckpointError, ConfigError
from osprey_data.target_model import TapLayers, TargetIdentity
from osprey_train.drafters.dflash.arch import VLLM_ARCHITECTURE, block_size_of, mask_token_of, shares_target_embedding
from osprey_train.drafters.registry import drafter_spec
from osprey_train.export.common import cast_floating, dtype_name
from osprey_train.export.serving import ServingRecommendation, recommend, serving_doc
from osprey_train.export.sglang import write_sglang_folder
from osprey_train.export.vllm import read_vllm, vllm_readme, write_vllm_folder
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig

__all__ = ["write_dflash_vllm", "read_dflash_vllm", "write_dflash_sglang", "read_dflash_sglang", "SHARED_WITH_TARGET",
           "target_layer_ids", "differing_k_norms", "VLLM_CPU_K_NORM_NOTE"]

SHARED_WITH_TARGET = ("embed_tokens.weight", "lm_head.weight")
"""Tensors vLLM takes from the target when the export has none."""


def target_layer_ids(taps: TapLayers) -> list[int]:
    """DFlash's ``target_layer_ids`` (decoder layer outputs, 0-based) of our taps (HF hidden_states ids)."""
    ids = [int(i) for i in taps.to_vllm()]
    if min(ids) < 1:
        raise ConfigError(f"export --format vllm: tap {min(ids)} is the embedding output, which a DFlash drafter "
                          "cannot name (dflash_config.target_layer_ids counts decoder layers); convert it again from "
                          "a store whose --layers are all >= 1")
    return [i - 1 for i in ids]


def _engine_layout(model: Drafter, dtype: torch.dtype) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json document, tensors) of the ``DFlashDraftModel`` layout both engines read."""
    cfg = model.config
    doc = {
        "architectures": [VLLM_ARCHITECTURE], "model_type": "qwen3",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False, "tie_word_embeddings": False, "vocab_size": cfg.vocab_size,
        "target_hidden_size": cfg.target_hidden_size, "block_size": block_size_of(cfg),
        "dflash_config": {"mask_token_id": mask_token_of(cfg), "target_layer_ids": target_layer_ids(cfg.tap_layers)},
        "torch_dtype": dtype_name(dtype),
        # provenance: the target (and tokenizer) this drafter serves, and the settings vLLM does not read
        "osprey_target": None if cfg.target is None else cfg.target.to_dict(),
        "osprey_arch_options": cfg.arch_options,
    }
    shared = SHARED_WITH_TARGET if cfg.target is not None and shares_target_embedding(cfg) else ()
    state = cast_floating({name: tensor for name, tensor in model.state_dict().items() if name not in shared}, dtype)
    return doc, state


VLLM_CPU_K_NORM_NOTE = """\
## Known issue: vLLM on CPU

This drafter's layers have different `k_norm` weights. vLLM 0.32 normalises the context keys of all
layers in one `rms_norm` call with the layers' weights stacked, and its CPU kernel applies layer 0's
weight to every layer (Osprey's `tests/train/engines/test_vllm_kernels.py` pins it). On CPU, vLLM
therefore serves a slightly different drafter: still lossless, but its acceptance can differ from
`osprey eval acceptance` (measured: one round of 146 on a test drafter). vLLM on CUDA was not checked.
"""


def differing_k_norms(state: dict[str, torch.Tensor]) -> bool:
    """Whether the layers' ``k_norm`` weights differ (what vLLM's CPU kernel gets wrong, see the note)."""
    weights = [t for name, t in state.items() if name.endswith("self_attn.k_norm.weight")]
    return any(not torch.equal(weights[0], w) for w in weights[1:])


def write_dflash_vllm(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool,
                      speculative_tokens: int | None = None) -> Path:
    """The ``DFlashDraftModel`` layout, which vLLM 0.32 loads natively (``method: dflash``)."""
    steps = block_size_of(model.config) - 1 if speculative_tokens is None else speculative_tokens
    doc, state = _engine_layout(model, dtype)
    readme = vllm_readme(model, out, speculative_tokens=steps)
    if differing_k_norms(state):
        readme += "\n" + VLLM_CPU_K_NORM_NOTE
    return write_vllm_folder(out, state, doc, source_dir, overwrite, readme)


def write_dflash_sglang(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool,
                        serving: ServingRecommendation | None = None) -> Path:
    """The same layout for SGLang's ``DFlashDraftModel`` (``--speculative-algorithm DFLASH``), with
    ``serving.json`` and ``README.md``: SGLang verifies the whole trained block each round
    (``--speculative-num-draft-tokens block_size``)."""
    cfg = model.config
    drafter_spec(cfg.arch).check_export(cfg, "sglang")
    if serving is not None and serving.tuned:
        raise ConfigError("export --format sglang --sweep: a sweep's shapes are chains and trees; SGLang's DFLASH "
                          "verifies the drafter's trained block each round (no tree to choose); export without --sweep")
    doc, state = _engine_layout(model, dtype)
    served = serving_doc(serving or recommend(None), export_dir=out, arch=cfg.arch,
                         target=None if cfg.target is None else cfg.target.name_or_path, dtype=dtype_name(dtype),
                         block_size=block_size_of(cfg))
    return write_sglang_folder(out, state, doc, served, source_dir=source_dir, overwrite=overwrite)


def read_dflash_sglang(path: Path) -> Drafter:
    """An SGLang DFLASH export read back (the vLLM reader: the layout is the same)."""
    return read_vllm(Path(path))


def _target_tensors(doc: dict, where: Path) -> dict[str, torch.Tensor]:
    """The target's embedding and LM head (tied or not), from the safetensors of the folder the export names."""
    name = (doc.get("osprey_target") or {}).get("name_or_path")
    folder = Path(name) if name else None
    files = sorted(folder.glob("*.safetensors")) if folder is not None and folder.is_dir() else []
    if not files:
        raise CheckpointError(f"{where}: this DFlash export holds no embedding and LM head (vLLM serves the "
                              f"target's); reading it back needs the target's safetensors folder, and "
                              f"{name!r} is not one here; read the drafter folder it was exported from instead")
    found: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                if key in ("model.embed_tokens.weight", "lm_head.weight"):
                    found[key] = f.get_tensor(key)
    if "model.embed_tokens.weight" not in found:
        raise CheckpointError(f"{where}: the target folder {folder} has no model.embed_tokens.weight")
    embed = found["model.embed_tokens.weight"]
    return {"embed_tokens.weight": embed, "lm_head.weight": found.get("lm_head.weight", embed)}


def read_dflash_vllm(doc: dict, raw: dict[str, torch.Tensor], where: Path) -> tuple[DrafterConfig, dict] | None:
    """(config, our state dict) of a ``DFlashDraftModel`` export; None when ``doc`` is another layout."""
    if doc.get("architectures") != [VLLM_ARCHITECTURE]:
        return None
    try:
        dflash = doc["dflash_config"]
        taps = TapLayers.from_vllm([i + 1 for i in dflash["target_layer_ids"]])
        options = {**doc.get("osprey_arch_options", {}), "block_size": doc["block_size"],
                   "mask_token_id": dflash["mask_token_id"]}
        target = doc.get("osprey_target")
        config = DrafterConfig(
            arch="dflash", family="qwen3", qk_norm=True, num_layers=doc["num_hidden_layers"],
            hidden_size=doc["hidden_size"], intermediate_size=doc["intermediate_size"],
            num_attention_heads=doc["num_attention_heads"], num_key_value_heads=doc["num_key_value_heads"],
            head_dim=doc["head_dim"], rms_norm_eps=doc["rms_norm_eps"], rope_theta=doc["rope_theta"],
            max_position_embeddings=doc["max_position_embeddings"], vocab_size=doc["vocab_size"],
            draft_vocab_size=doc["vocab_size"], target_hidden_size=doc["target_hidden_size"], tap_layers=taps,
            target=None if target is None else TargetIdentity.from_dict(target), arch_options=options)
    except KeyError as exc:
        raise CheckpointError(f"{where}: lacks {exc}; not a DFlash vLLM checkpoint") from None
    except ConfigError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    state = dict(raw)
    if any(name not in state for name in SHARED_WITH_TARGET):
        dtype = next(v.dtype for v in raw.values() if v.is_floating_point())
        state.update({k: v.to(dtype) for k, v in _target_tensors(doc, where).items() if k not in state})
    return config, state


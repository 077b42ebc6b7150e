"""The target's LM head, loaded alone from its safetensors checkpoint (for ``--target-dist full``).

Only the one weight matrix is read (``safe_open`` + ``get_tensor``), never the whole model:
single-file ``model.safetensors``, sharded ``model.safetensors.index.json`` and tied-embedding
checkpoints (no ``lm_head.weight``: the input embedding is the head) are all supported. Gemma-2
style ``final_logit_softcapping`` from ``config.json`` is applied.

Legend: N rows, Dt target hidden, Vt target vocab.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from osprey_data import jsonio
from osprey_data.errors import InputError, ModelError

__all__ = ["TargetHead", "load_target_head", "find_head_tensor"]

_HEAD_KEYS = ("lm_head.weight", "model.lm_head.weight", "language_model.lm_head.weight")
_EMBED_SUFFIX = "embed_tokens.weight"


class TargetHead(nn.Module):
    """``final_hidden_NDt -> logits_NVt`` of the target (frozen)."""

    def __init__(self, weight_VtDt: Tensor, softcap: float | None = None) -> None:
        super().__init__()
        self.register_buffer("weight_VtDt", weight_VtDt, persistent=False)
        self.softcap = softcap

    @property
    def vocab_size(self) -> int:
        return self.weight_VtDt.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.weight_VtDt.shape[1]

    def forward(self, final_hidden_NDt: Tensor) -> Tensor:
        logits = torch.nn.functional.linear(final_hidden_NDt.to(self.weight_VtDt.dtype), self.weight_VtDt)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise InputError(f"{path}: no config.json; pass the target's HF model folder")
    try:
        cfg = jsonio.loads(path.read_bytes())   # bounded nesting: no RecursionError
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def _tensor_files(model_dir: Path) -> dict[str, Path]:
    """Map tensor name -> safetensors file, for single-file and sharded checkpoints."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            doc = jsonio.loads(index.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{index}: not valid JSON ({exc})") from None
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict):
            raise InputError(f"{index}: no 'weight_map' object")
        return {k: model_dir / v for k, v in weight_map.items()}
    single = model_dir / "model.safetensors"
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return {k: single for k in f.keys()}
    raise InputError(f"{model_dir}: no model.safetensors or model.safetensors.index.json "
                     "(the full-vocabulary target needs the target's safetensors weights)")


def find_head_tensor(model_dir: str | Path) -> tuple[str, Path]:
    """Name and file of the tensor that is the target's LM head (tied -> input embedding)."""
    model_dir = Path(model_dir)
    cfg = _config(model_dir)
    files = _tensor_files(model_dir)
    tied = cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings"))
    if not tied:
        for key in _HEAD_KEYS:
            if key in files:
                return key, files[key]
    embeds = sorted((k for k in files if k.endswith(_EMBED_SUFFIX)), key=len)
    if embeds and (tied or not any(k in files for k in _HEAD_KEYS)):
        return embeds[0], files[embeds[0]]
    raise ModelError(f"{model_dir}: found neither an LM head ({', '.join(_HEAD_KEYS)}) nor an "
                     f"input embedding (*{_EMBED_SUFFIX}) in the safetensors files")


def load_target_head(model_dir: str | Path, *, device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32) -> TargetHead:
    """Load only the target's LM head from ``model_dir``."""
    model_dir = Path(model_dir)
    key, file = find_head_tensor(model_dir)
    if not file.is_file():
        raise InputError(f"{file}: shard named by the index is missing")
    with safe_open(str(file), framework="pt") as f:
        weight = f.get_tensor(key)
    cfg = _config(model_dir)
    softcap = cfg.get("final_logit_softcapping", cfg.get("text_config", {}).get("final_logit_softcapping"))
    return TargetHead(weight.to(device=device, dtype=dtype), softcap=softcap).requires_grad_(False)

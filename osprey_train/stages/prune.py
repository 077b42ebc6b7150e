"""Stage 1 (prune): keep a small LM's embedding, its first N decoder blocks, final norm and LM head.

The result is an ordinary HF checkpoint (loads with ``AutoModelForCausalLM``) whose config says
``num_hidden_layers = N`` and whose per-layer metadata (``layer_types`` and any other list with one
entry per layer) is cut to the kept layers. It computes exactly what the source computes when
the source's hidden state after block N is sent straight to the final norm and LM head.

Any causal LM transformers can load works as a source (Llama, Qwen2/3, Gemma-3, ...); Stage 3
accepts the families listed in ``osprey_train.models.hf.FAMILY_OF_MODEL_TYPE``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.atomic import atomic_dir, write_json
from osprey_data.errors import ConfigError, ModelError
from osprey_data.target_model import load_hf_target, peek_model_config

__all__ = ["PruneConfig", "PruneResult", "run", "prune_model", "check_kept_layers", "load_source", "save_hf_atomic"]


@dataclass(kw_only=True)
class PruneConfig:
    """Options of ``osprey train prune``."""

    source: str
    """Source model: local HF folder, .gguf file, or hub id (online only)."""
    layers: int
    """Number N of leading decoder blocks to keep."""
    out: Path
    """Output folder (HF checkpoint + tokenizer + prune_info.json); an existing one is refused unless --overwrite."""
    gguf_file: str | None = None
    """GGUF file name inside ``source`` (when source is a folder)."""
    overwrite: bool = False
    """Replace ``out`` when it already exists (atomically: the old folder stays until the new one is written)."""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if not isinstance(self.layers, int) or self.layers < 1:
            raise ConfigError(f"prune: --layers must be a positive integer, got {self.layers!r}")
        if self.out.exists() and not self.overwrite:
            raise ConfigError(f"prune: output folder {self.out} exists; pass --overwrite or choose another --out")


@dataclass(kw_only=True)
class PruneResult:
    """What prune wrote."""

    out: Path
    """The output folder."""
    source_layers: int
    """Decoder blocks in the source."""
    kept_layers: int
    """Decoder blocks kept."""
    num_parameters: int
    """Parameters of the pruned model."""
    patched_keys: list[str] = field(default_factory=list)
    """Config keys that were cut to the kept layers."""


def load_source(name_or_path: str, *, gguf_file: str | None = None) -> tuple[Any, Any]:
    """Load a source/target model + tokenizer with the target loader (folder, GGUF, hub id)."""
    return load_hf_target(name_or_path, gguf_file=gguf_file, device="cpu")


def _decoder_layers_owner(model: Any) -> Any:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers"):
        raise ModelError(f"{type(model).__name__}: cannot find its decoder layers (expected model.layers)")
    return decoder


def check_kept_layers(num_layers: int, total: int, *, where: str) -> None:
    """Refuse to keep more blocks than the source has (``where``: the source, or its config.json)."""
    if num_layers > total:
        raise ConfigError(f"prune --layers {num_layers}: {where} has {total} decoder layers; cannot keep "
                          f"{num_layers}: pass --layers 1..{total}")


def prune_model(model: Any, num_layers: int, *, where: str = "source") -> list[str]:
    """Cut ``model`` (in place) to its first ``num_layers`` blocks; returns the patched config keys."""
    import torch

    decoder = _decoder_layers_owner(model)
    total = len(decoder.layers)
    check_kept_layers(num_layers, total, where=where)
    decoder.layers = torch.nn.ModuleList(list(decoder.layers)[:num_layers])
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    patched = ["num_hidden_layers"]
    for key, value in list(vars(config).items()):
        # Any per-layer list (layer_types, per-layer windows, ...) follows the kept blocks.
        if isinstance(value, (list, tuple)) and len(value) == total and key != "num_hidden_layers":
            setattr(config, key, type(value)(value[:num_layers]))
            patched.append(key)
    if isinstance(getattr(config, "max_window_layers", None), int):
        config.max_window_layers = min(config.max_window_layers, num_layers)
        patched.append("max_window_layers")
    config.num_hidden_layers = num_layers
    return patched


def save_hf_atomic(model: Any, tokenizer: Any, out: Path, extra: dict[str, Any] | None = None) -> None:
    """save_pretrained model + tokenizer (+ JSON side files) into a temp folder, rename into place."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # GGUF-loaded models carry a dequantizing quantizer that save_pretrained refuses to serialize.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    with atomic_dir(out, overwrite=True) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, doc in (extra or {}).items():
            write_json(tmp / name, doc)


def run(config: PruneConfig) -> PruneResult:
    """Load the source, keep its first N blocks, write an HF checkpoint to ``config.out``."""
    shape = peek_model_config(config.source, config.gguf_file, option="--source")
    if shape is not None and shape.num_layers is not None:   # before the weights load
        check_kept_layers(config.layers, shape.num_layers, where=shape.path)
    model, tokenizer = load_source(config.source, gguf_file=config.gguf_file)
    total = len(_decoder_layers_owner(model).layers)
    patched = prune_model(model, config.layers, where=config.source)
    info = {"source": str(config.source), "source_layers": total, "kept_layers": config.layers,
            "patched_config_keys": patched}
    save_hf_atomic(model, tokenizer, config.out, {"prune_info.json": info})
    return PruneResult(out=config.out, source_layers=total, kept_layers=config.layers,
                       num_parameters=sum(p.numel() for p in model.parameters()), patched_keys=patched)

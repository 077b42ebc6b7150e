"""Saving and loading drafter checkpoints: ``model.safetensors`` + ``config.json``, no pickle.

``config.json`` is the DrafterConfig plus ``format: "osprey-drafter"`` and ``format_version: 1``
and is validated against ``schemas/drafter-config.v1.json`` both ways. The folder is written under
a temporary name and renamed into place, so a half-written checkpoint never looks complete.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from osprey_data import jsonio
from osprey_data.atomic import atomic_dir, atomic_file, write_json
from osprey_data.errors import CheckpointError, ConfigError
from osprey_data.schema_check import validate
from osprey_train.drafters.registry import drafter_spec
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig

__all__ = ["save_drafter", "load_drafter", "build_drafter", "read_drafter_config", "write_drafter_folder",
           "write_safetensors", "CONFIG_FILE", "WEIGHTS_FILE", "FORMAT_NAME", "FORMAT_VERSION"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT_NAME = "osprey-drafter"
FORMAT_VERSION = 1
SCHEMA = "drafter-config.v1.json"


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
                      ) -> None:
    """``safetensors.torch.save_file`` whose failure (a full disk: safetensors raises its own
    ``SafetensorError``, not ``OSError``) is one :class:`CheckpointError` naming the file."""
    try:
        save_file(tensors, str(path), metadata=metadata)
    except (SafetensorError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: cannot write ({reason}); free disk space or check that the folder is "
                              "writable, then rerun (nothing half-written is used)") from None


def build_drafter(config: DrafterConfig) -> Drafter:
    """A randomly initialised drafter of ``config.arch`` (its registered model class)."""
    return drafter_spec(config.arch).load("model_class")(config)


def config_document(config: DrafterConfig) -> dict:
    """The config.json document for ``config``."""
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **config.to_dict()}


def read_drafter_config(path: str | Path) -> DrafterConfig:
    """Read and validate ``path``/config.json (or a config.json path)."""
    path = Path(path)
    file = path / CONFIG_FILE if path.is_dir() else path
    if not file.is_file():
        raise CheckpointError(f"{file}: no drafter config.json here; is {path} a drafter checkpoint folder?")
    try:
        doc = jsonio.loads(file.read_bytes())   # bounded nesting: a crafted file is no RecursionError
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{file}: not UTF-8 text, so not a drafter config.json") from None
    if isinstance(doc, dict) and doc.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{file}: format is {doc.get('format')!r}, not {FORMAT_NAME!r}; this is not an Osprey drafter "
            "checkpoint (an HF model folder? convert it with `osprey train convert`)"
        )
    validate(doc, SCHEMA, where=str(file))
    fields = {k: v for k, v in doc.items() if k not in ("format", "format_version")}
    try:
        return DrafterConfig.from_dict(fields)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def save_drafter(model: Drafter, out_dir: str | Path) -> Path:
    """Write ``model.safetensors`` + ``config.json`` into ``out_dir`` (replaced atomically)."""
    out_dir = Path(out_dir)
    doc = config_document(model.config)
    validate(doc, SCHEMA, where=f"{out_dir / CONFIG_FILE} (being written)")
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if not out_dir.exists():
        # Fresh folder: build it under a temporary name, then rename it into place.
        with atomic_dir(out_dir) as tmp:
            _write_checkpoint(tmp, state, doc)
        return out_dir
    # Existing folder (other files such as a tokenizer or alignment stats stay): remove the old
    # config first, so that until the new config lands the folder never looks complete.
    (out_dir / CONFIG_FILE).unlink(missing_ok=True)
    _write_checkpoint(out_dir, state, doc)
    return out_dir


def _write_checkpoint(folder: Path, state: dict[str, torch.Tensor], doc: dict) -> None:
    """Weights first, config last: a folder with a config.json is complete."""
    with atomic_file(folder / WEIGHTS_FILE) as tmp:
        write_safetensors(state, tmp, metadata={"format": "pt", "osprey": FORMAT_NAME})
    write_json(folder / CONFIG_FILE, doc)


def load_drafter(path: str | Path, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> Drafter:
    """Load a drafter folder written by :func:`save_drafter`; strict about missing/extra tensors."""
    path = Path(path)
    config = read_drafter_config(path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing; the drafter checkpoint in {path} is incomplete")
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights}: cannot read safetensors ({exc}); the file is damaged") from None
    model = build_drafter(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{weights}: tensors do not match the config in {path / CONFIG_FILE}: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"{weights}: tensor {name} has shape {tuple(tensor.shape)}, the config implies "
                f"{tuple(expected[name].shape)}"
            )
        if name == "d2t":
            _check_d2t(tensor, config, weights)
        # a NaN/inf weight would be exported, evaluated or trained on without a word
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"{weights}: tensor {name} holds {bad} NaN/inf value(s); the drafter is damaged "
                                  "or its training diverged: use an earlier checkpoint or retrain")
    model.load_state_dict(state, strict=True)
    # Floating parameters take `dtype`; integer buffers (d2t) keep theirs.
    model.to(device=device)
    for module in model.modules():
        for param in list(module._parameters.values()):
            if param is not None and param.is_floating_point():
                param.data = param.data.to(dtype)
    return model.eval()


def _check_d2t(d2t: torch.Tensor, config: DrafterConfig, weights: Path) -> None:
    """The draft vocabulary must be what ``set_draft_vocab`` accepts: integer target ids in
    [0, vocab_size), strictly increasing; an id out of range would index past the target's
    vocabulary (an IndexError deep in training or evaluation, or a wrong token served)."""
    problem = None
    if d2t.is_floating_point() or d2t.dtype == torch.bool:
        problem = f"has dtype {d2t.dtype}, not integer ids"
    elif d2t.numel() and (int(d2t.min()) < 0 or int(d2t.max()) >= config.vocab_size):
        problem = (f"holds target ids in [{int(d2t.min())}, {int(d2t.max())}], outside the target vocabulary "
                   f"[0, {config.vocab_size})")
    elif d2t.numel() > 1 and not bool((d2t[1:] > d2t[:-1]).all()):
        problem = "is not strictly increasing (sorted target ids, no duplicates)"
    if problem is not None:
        raise CheckpointError(f"{weights}: draft vocabulary d2t {problem}; the drafter is damaged: convert it again")


def write_drafter_folder(model: Any, out: Path, *, tokenizer: Any = None, extra: dict[str, Any] | None = None,
                         overwrite: bool = False) -> Path:
    """save_drafter + tokenizer + JSON side files into a temp folder, then moved into place."""
    out = Path(out)
    with atomic_dir(out, overwrite=overwrite, exists_message=f"{out} exists; pass --overwrite") as tmp:
        save_drafter(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, doc in (extra or {}).items():
            write_json(tmp / name, doc)
    return out

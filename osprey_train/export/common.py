"""Shared pieces of the exporters: dtypes, d2t/t2d maps, atomic folder writing, side files.

Legend: V target vocab, Vd draft vocab.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from osprey_data import jsonio
from osprey_data.atomic import atomic_dir
from osprey_data.errors import CheckpointError, ModelError
from osprey_train.models.io import write_safetensors

__all__ = ["DTYPES", "dtype_name", "cast_floating", "check_representable", "write_folder", "copy_side_files", "offset_d2t", "absolute_d2t",
           "t2d_mask", "read_json", "save_tensors", "load_tensors", "SIDE_FILES"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Files next to a drafter that travel with every export (tokenizer of the target, stats, and the
# speculation profile, which export checks against the weights first: check_profile)
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
              "vocab.json", "merges.txt", "tokenizer.model", "alignment_stats.json", "draft_vocab.json",
              "speculation_profile.json")


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32 etc."""
    return str(dtype).removeprefix("torch.")


def check_representable(state: dict[str, torch.Tensor], dtype: torch.dtype, where: str = "export") -> None:
    """Refuse floating tensors whose finite values lie beyond ``dtype``'s range (float16: 65504), which a
    cast would silently turn into inf; the error names each such tensor and its largest |value|.

    Values already inf or NaN are left to the drafter's own checks; only a finite value that the cast
    itself would destroy is refused.
    """
    if not dtype.is_floating_point:
        return
    limit = torch.finfo(dtype).max
    over = []
    for name, tensor in state.items():
        if not tensor.is_floating_point() or torch.finfo(tensor.dtype).max <= limit:
            continue
        finite = tensor.detach().abs().nan_to_num(nan=0.0, posinf=0.0)
        if finite.numel() and (peak := float(finite.max())) > limit:
            # a value just above the limit may still round down to it: keep only those that overflow
            if torch.isinf(tensor.detach()[tensor.detach().isfinite()].to(dtype)).any():
                over.append((peak, name))
    if over:
        over.sort(reverse=True)
        named = ", ".join(f"{name!r} (largest |value| {peak:.6g})" for peak, name in over[:3])
        more = f" and {len(over) - 3} more" if len(over) > 3 else ""
        raise ModelError(
            f"{where}: {named}{more} hold finite weights above {dtype_name(dtype)}'s largest value "
            f"({limit:.6g}); cast to {dtype_name(dtype)} they would become inf. Export with --dtype bfloat16 "
            f"(float32's range) or --dtype float32 instead")


def cast_floating(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``state`` with its floating tensors in ``dtype``; integer and bool tensors keep theirs (an id map
    cast to bf16 would round ids above 256). A finite value beyond ``dtype``'s range is refused
    (:func:`check_representable`), never turned into inf."""
    check_representable(state, dtype)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def offset_d2t(draft_to_target_Vd: torch.Tensor) -> torch.Tensor:
    """Engine d2t: target_id = draft_id + d2t[draft_id] (SGLang hot_token_id, vLLM draft_id_to_target_id)."""
    ids = draft_to_target_Vd.to(torch.long)
    return ids - torch.arange(ids.shape[0], dtype=torch.long)


def absolute_d2t(offset_Vd: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`offset_d2t`."""
    return offset_Vd.to(torch.long) + torch.arange(offset_Vd.shape[0], dtype=torch.long)


def t2d_mask(draft_to_target_Vd: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Engine t2d: bool (V,), True where a target token has a draft id."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[draft_to_target_Vd.to(torch.long)] = True
    return mask


def save_tensors(state: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors file (contiguous CPU tensors), metadata format=pt as the engines expect."""
    write_safetensors({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, path,
                      metadata={"format": "pt"})


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; a damaged/missing file is a CheckpointError naming it."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: cannot read safetensors ({exc})") from None


def read_json(path: Path) -> dict:
    """Parse a JSON file with a CheckpointError naming file and line on failure."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return jsonio.loads(path.read_bytes())   # bounded nesting: no RecursionError
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text, so not a JSON file") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None


def copy_side_files(src: Path | None, dst: Path) -> list[str]:
    """Copy tokenizer / stats files that exist next to the source drafter."""
    copied = []
    if src is None:
        return copied
    for name in SIDE_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, dst / name)
            copied.append(name)
    return copied


def write_folder(out: Path, fill: Callable[[Path], None], *, overwrite: bool) -> Path:
    """Create ``out`` by calling ``fill(tmp_dir)`` on a temporary folder moved into place after."""
    with atomic_dir(out, overwrite=overwrite,
                    exists_message=f"export: output folder {out} exists; pass --overwrite or choose another --out") as tmp:
        fill(tmp)
    return Path(out)

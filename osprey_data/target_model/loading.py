"""Loading a target model and its tokenizer with transformers, and choosing its device.

torch and transformers are imported inside the functions: they are heavy, and the CLI imports
the data package on its ``--help`` path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osprey_data.errors import ConfigError, InputError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["load_hf_target", "resolve_device", "check_device", "DEVICE_FORMS", "split_gguf", "check_target_exists"]


DEVICE_FORMS = "auto, cpu, cuda or cuda:N"
"""The device strings every command accepts (``--device``)."""
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def check_device(device: object, where: str = "", option: str = "--device") -> str:
    """``device`` if it is one of :data:`DEVICE_FORMS`, else :class:`ConfigError` (``where`` prefixes
    the message). Checks the spelling only (no torch): config ``__post_init__`` calls it, so a typo
    such as ``gpu`` fails before any model loads; :func:`resolve_device` checks CUDA is there."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ConfigError(f"{where}{': ' if where else ''}{option} {device!r} is not a device; use {DEVICE_FORMS}")
    return device


def resolve_device(device: str) -> str:
    """Map ``"auto"`` to ``"cuda"`` when available, else ``"cpu"``; check explicit CUDA asks."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    return device


def split_gguf(name_or_path: str, gguf_file: str | None) -> tuple[str, str | None]:
    """Accept either ``folder + gguf_file`` or a direct path to a ``.gguf`` file."""
    if gguf_file is None and name_or_path.endswith(".gguf"):
        p = Path(name_or_path)
        return str(p.parent), p.name
    return name_or_path, gguf_file


def _looks_local(name_or_path: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else (``./x``, ``/abs``, ``a/b/c``) is a path."""
    return name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 \
        or Path(name_or_path).expanduser().exists()


def check_target_exists(name_or_path: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(folder, gguf file) of a target, or InputError when a local one is missing (no loading)."""
    folder, gguf = split_gguf(str(name_or_path), gguf_file)
    if _looks_local(folder) and not Path(folder).expanduser().exists():
        raise InputError(f"target {name_or_path!r}: no such folder or file; pass a local model folder, "
                         f"a .gguf file or a hub id")
    if gguf is not None and Path(folder).exists() and not (Path(folder) / gguf).is_file():
        raise InputError(f"target {name_or_path!r}: GGUF file {gguf!r} not found in {folder}")
    return folder, gguf


def load_hf_target(name_or_path: str, *, gguf_file: str | None = None, device: str = "cpu",
                   dtype: "torch.dtype | None" = None) -> "tuple[PreTrainedModel, PreTrainedTokenizerBase]":
    """Load a causal-LM target and its tokenizer with transformers, in eval mode.

    Args:
        name_or_path: a local folder, a hub id (only works online), or a path to a ``.gguf`` file.
        gguf_file: file name inside ``name_or_path`` to load through transformers' GGUF support.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.
        dtype: weights dtype (default float32).

    Raises:
        InputError: the folder or file is missing or is not a loadable causal LM.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if dtype is None else dtype
    folder, gguf = check_target_exists(name_or_path, gguf_file)
    folder = str(Path(folder).expanduser()) if Path(folder).expanduser().exists() else folder
    device = resolve_device(device)
    kwargs: dict[str, Any] = {"gguf_file": gguf} if gguf is not None else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"target {name_or_path!r}: cannot load its tokenizer: {exc}") from exc
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"target {name_or_path!r}: cannot load it as a causal LM: {exc}") from exc
    model.to(device)
    model.eval()
    return model, tokenizer

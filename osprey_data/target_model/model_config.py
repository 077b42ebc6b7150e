"""A model's sizes read from its config alone, so options are checked before any weights load.

Loading a target costs seconds to minutes (importing torch and transformers alone is ~2 s on a
small CPU); its ``config.json`` is a few hundred bytes of JSON. :func:`peek_model_config` reads
the sizes every early check needs (decoder layers, hidden width, vocabulary, position limit)
with the standard library, so that ``--taps 2,15,99`` or a drafter converted for another target
is refused at once, naming the file the sizes came from.

What can be read where:

- a local HF folder: its ``config.json`` (the decoder's part, ``text_config``, for a multimodal
  one); a folder without it is refused, as no loader could use it;
- a ``.gguf`` file: its metadata header (``{arch}.block_count``, ``embedding_length``,
  ``context_length``, the tokenizer's token list), read through the ``gguf`` package with the
  tensors memory-mapped, not read; without that package nothing is checked early;
- a hub id: nothing (reading its config may need the network); the load checks it.

Every size is optional: a config lacking one leaves its check to the load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.errors import InputError, ModelError
from osprey_data.target_model.loading import check_target_exists

__all__ = ["ModelShape", "peek_model_config", "has_chat_template", "check_chat_template"]

CONFIG_FILE = "config.json"

# HF spellings of each size across families (transformers maps them with ``attribute_map``).
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len")


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The sizes of a model as its config states them (no weights loaded)."""

    path: str
    """The file the sizes were read from (``config.json`` or the ``.gguf``), for error messages."""
    num_layers: int | None = None
    """Decoder layers L (``num_hidden_layers``); valid taps are 1..L-1."""
    hidden_size: int | None = None
    """Width of the hidden states."""
    vocab_size: int | None = None
    """Vocabulary (LM-head rows)."""
    max_position_embeddings: int | None = None
    """Longest sequence the position encoding covers."""
    model_type: str | None = None
    """HF ``model_type`` of the decoder (``llama``, ``qwen3``, ...; GGUF: its architecture)."""
    text_config: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The decoder's config.json keys as written (empty for GGUF), for family checks."""


def _first_int(doc: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _from_config_json(file: Path) -> ModelShape:
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{file}: not a readable config.json ({exc}); restore the model folder "
                         "(save_pretrained writes it)") from None
    if not isinstance(doc, dict):
        raise InputError(f"{file}: config.json holds {type(doc).__name__}, not an object; restore the model folder")
    text = doc.get("text_config")
    text = {**doc, **text} if isinstance(text, dict) else doc
    model_type = text.get("model_type")
    return ModelShape(path=str(file), num_layers=_first_int(text, _LAYERS), hidden_size=_first_int(text, _HIDDEN),
                      vocab_size=_first_int(text, ("vocab_size",)),
                      max_position_embeddings=_first_int(text, _POSITIONS),
                      model_type=model_type if isinstance(model_type, str) else None, text_config=text)


def _from_gguf(file: Path) -> ModelShape | None:
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    try:
        reader = GGUFReader(str(file))
    except (OSError, ValueError) as exc:
        raise InputError(f"{file}: not a readable GGUF file ({exc})") from None

    def value(key: str) -> Any:
        f = reader.get_field(key)
        return None if f is None else f.contents()

    arch = value("general.architecture")
    if not isinstance(arch, str):
        return None
    tokens = reader.get_field("tokenizer.ggml.tokens")
    ints = {name: value(f"{arch}.{name}") for name in ("block_count", "embedding_length", "context_length")}
    ints = {k: int(v) if isinstance(v, int) and v > 0 else None for k, v in ints.items()}
    return ModelShape(path=str(file), num_layers=ints["block_count"], hidden_size=ints["embedding_length"],
                      vocab_size=len(tokens.data) if tokens is not None else None,
                      max_position_embeddings=ints["context_length"], model_type=arch)


def peek_model_config(name_or_path: str, gguf_file: str | None = None, *, option: str = "--target"
                      ) -> ModelShape | None:
    """The sizes of the model at ``name_or_path`` from its config alone, or None when they cannot
    be read without loading it (a hub id; a GGUF file without the ``gguf`` package).

    Args:
        name_or_path: a local folder, a ``.gguf`` path or a hub id.
        gguf_file: a GGUF file name inside the folder ``name_or_path``.
        option: the option that named the model, quoted in errors.

    Raises:
        InputError: a local model is missing, or its folder has no readable ``config.json``.
    """
    try:
        folder, gguf = check_target_exists(name_or_path, gguf_file)
    except InputError as exc:
        raise InputError(f"{option}: {exc}") from None
    root = Path(folder).expanduser()
    if not root.exists():
        return None   # a hub id
    if gguf is not None:
        return _from_gguf(root / gguf)
    file = root / CONFIG_FILE
    if not file.is_file():
        raise InputError(f"{option} {name_or_path}: no {CONFIG_FILE} in {root}; pass a model folder written by "
                         "save_pretrained (config.json + weights) or a .gguf file")
    return _from_config_json(file)


def has_chat_template(name_or_path: str, gguf_file: str | None = None) -> bool | None:
    """Whether the tokenizer at ``name_or_path`` ships a chat template, from its files alone
    (``chat_template.jinja``, ``chat_template.json`` or ``tokenizer_config.json``'s
    ``chat_template``); None when that cannot be told without loading it (a hub id, a GGUF file)."""
    folder, gguf = check_target_exists(name_or_path, gguf_file)
    root = Path(folder).expanduser()
    if gguf is not None or not root.is_dir():
        return None
    if (root / "chat_template.jinja").is_file() or (root / "chat_template.json").is_file() \
            or (root / "additional_chat_templates").is_dir():
        return True
    file = root / "tokenizer_config.json"
    if not file.is_file():
        return None
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None   # the tokenizer load names the damage
    return bool(doc.get("chat_template")) if isinstance(doc, dict) else None


def check_chat_template(name_or_path: str, gguf_file: str | None = None, *, option: str = "--target") -> None:
    """Refuse, before the model loads, a target whose tokenizer files carry no chat template.

    Raises:
        ModelError: :func:`has_chat_template` is False (None, unknown, passes: the load decides).
    """
    if has_chat_template(name_or_path, gguf_file) is False:
        folder = Path(check_target_exists(name_or_path, gguf_file)[0]).expanduser()
        raise ModelError(f"{option} {name_or_path}: its tokenizer has no chat template (no chat_template.jinja, "
                         f"and no chat_template in {folder / 'tokenizer_config.json'}); pass --chat-template FILE, "
                         "or give pre-formatted `text` inputs")

"""Loading a target model and naming it: the identity every store and drafter is keyed on.

A store is only usable with the exact target that produced it, so :func:`identify_target`
hashes what changes the features (the model config and the tokenizer's vocabulary) into a
:class:`~osprey_data.store.TargetIdentity`. The hashes deliberately ignore volatile fields
(``transformers_version``, ``_name_or_path``, the load dtype) so that the same checkpoint loaded
from a folder, from a GGUF file or on another machine gets the same identity.

:func:`default_tap_layers` is the EAGLE-3 default ``[2, L//2, L-3]`` in the HF
``output_hidden_states`` convention (index 0 = embeddings, index i = output of decoder layer
i-1 = input of decoder layer i), which is also where SGLang and vLLM capture by default.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osprey_data.errors import ConfigError, InputError, ModelError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from osprey_data.store import TapLayers, TargetIdentity

__all__ = [
    "load_hf_target",
    "identify_target",
    "default_tap_layers",
    "config_hash",
    "tokenizer_hash",
    "chat_template_hash",
    "resolve_device",
    "text_config",
]

# Config keys that describe how/where a checkpoint was saved or loaded, not what it computes.
_VOLATILE_CONFIG_KEYS = frozenset({
    "transformers_version", "_name_or_path", "_model_name_or_path", "name_or_path",
    "torch_dtype", "dtype", "_commit_hash", "_attn_implementation", "_attn_implementation_internal",
    "attn_implementation", "use_cache", "output_hidden_states", "output_attentions",
    "return_dict", "quantization_config", "_is_quantized", "architectures",
})


def _sha256_json(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _strip_volatile(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_volatile(v) for k, v in obj.items() if k not in _VOLATILE_CONFIG_KEYS}
    if isinstance(obj, list):
        return [_strip_volatile(v) for v in obj]
    return obj


def text_config(config: Any) -> Any:
    """The text (decoder) part of a config; multimodal configs nest it."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def config_hash(config: Any) -> str:
    """SHA-256 of the model config without load/save bookkeeping fields."""
    return _sha256_json(_strip_volatile(config.to_dict()))


def tokenizer_hash(tokenizer: Any) -> str:
    """SHA-256 of the token -> id mapping plus the ids of the special tokens.

    The vocabulary (including added tokens) fixes what every stored token id means; bos/eos
    decide where sequences end. Tokenizer class names and file layouts are not hashed, so a
    tokenizer read from GGUF and the same one saved as ``tokenizer.json`` hash the same.
    """
    vocab = tokenizer.get_vocab()
    specials = {
        name: getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "unk")
    }
    return _sha256_json({"vocab": sorted(vocab.items(), key=lambda kv: kv[1]), "specials": specials})


def chat_template_hash(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's chat template text ("" when it has none)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates
        template = json.dumps(template, sort_keys=True)
    return hashlib.sha256(str(template).encode("utf-8")).hexdigest()


def resolve_device(device: str) -> str:
    """Map ``"auto"`` to ``"cuda"`` when available, else ``"cpu"``; check explicit CUDA asks."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    return device


def _split_gguf(name_or_path: str, gguf_file: str | None) -> tuple[str, str | None]:
    """Accept either ``folder + gguf_file`` or a direct path to a ``.gguf`` file."""
    if gguf_file is None and name_or_path.endswith(".gguf"):
        p = Path(name_or_path)
        return str(p.parent), p.name
    return name_or_path, gguf_file


def _looks_local(name_or_path: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else (``./x``, ``/abs``, ``a/b/c``) is a path."""
    return name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 \
        or Path(name_or_path).expanduser().exists()


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
    folder, gguf = _split_gguf(str(name_or_path), gguf_file)
    if _looks_local(folder) and not Path(folder).expanduser().exists():
        raise InputError(f"target {name_or_path!r}: no such folder or file; pass a local model folder, "
                         f"a .gguf file or a hub id")
    if gguf is not None and Path(folder).exists() and not (Path(folder) / gguf).is_file():
        raise InputError(f"target {name_or_path!r}: GGUF file {gguf!r} not found in {folder}")
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


def identify_target(model: Any, tokenizer: Any, name_or_path: str) -> "TargetIdentity":
    """Describe ``model`` + ``tokenizer`` as a :class:`TargetIdentity` with stable hashes."""
    from osprey_data.store import TargetIdentity

    cfg = text_config(model.config)
    try:
        hidden_size = int(cfg.hidden_size)
        num_layers = int(cfg.num_hidden_layers)
    except AttributeError as exc:
        raise ModelError(f"target {name_or_path!r}: config has no hidden_size/num_hidden_layers") from exc
    vocab_size = int(model.get_output_embeddings().weight.shape[0]) \
        if model.get_output_embeddings() is not None else int(cfg.vocab_size)
    return TargetIdentity(
        name_or_path=str(name_or_path),
        model_type=str(getattr(cfg, "model_type", None) or model.config.model_type),
        config_hash=config_hash(model.config),
        tokenizer_hash=tokenizer_hash(tokenizer),
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
    )


def default_tap_layers(num_layers: int) -> "TapLayers":
    """EAGLE-3's default taps ``[2, L//2, L-3]`` (HF ``hidden_states`` convention).

    Raises:
        ConfigError: for ``num_layers < 5``, where the formula would not be increasing; pass
            explicit ``--layers`` for such tiny models.
    """
    from osprey_data.store import TapLayers

    if num_layers < 5:
        raise ConfigError(f"default taps [2, L//2, L-3] need at least 5 layers (target has "
                          f"{num_layers}); pass --layers explicitly")
    return TapLayers(layer_ids=(2, num_layers // 2, num_layers - 3))

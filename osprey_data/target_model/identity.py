"""The identity every store and drafter is keyed on: which target, by content hash.

A store is only usable with the exact target that produced it, so :func:`identify_target`
hashes what changes the features (the model config and the tokenizer's vocabulary) into a
:class:`TargetIdentity`. The hashes deliberately ignore volatile fields (``transformers_version``,
``_name_or_path``, the load dtype) so that the same checkpoint loaded from a folder, from a GGUF
file or on another machine gets the same identity.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from osprey_data.errors import ConfigError, ModelError

__all__ = ["TargetIdentity", "identify_target", "config_hash", "tokenizer_hash", "chat_template_hash",
           "text_config"]

# Config keys that describe how/where a checkpoint was saved or loaded, not what it computes.
_VOLATILE_CONFIG_KEYS = frozenset({
    "transformers_version", "_name_or_path", "_model_name_or_path", "name_or_path",
    "torch_dtype", "dtype", "_commit_hash", "_attn_implementation", "_attn_implementation_internal",
    "attn_implementation", "use_cache", "output_hidden_states", "output_attentions",
    "return_dict", "quantization_config", "_is_quantized", "architectures",
})


@dataclass(frozen=True, kw_only=True)
class TargetIdentity:
    """Which target model produced a store or a drafter's training data (hashes make 'same target' checkable)."""

    name_or_path: str
    """Where the target was loaded from (informational; the hashes decide identity)."""
    model_type: str
    """HF ``model_type`` of the text decoder (``llama``, ``qwen3``, ...)."""
    config_hash: str
    """:func:`config_hash` of the model config."""
    tokenizer_hash: str
    """:func:`tokenizer_hash` of the tokenizer."""
    vocab_size: int
    """Rows of the target's LM head."""
    hidden_size: int
    """Width Dt of the target's hidden states."""
    num_layers: int
    """Decoder layers L (valid taps are 0..L)."""
    dtype: str
    """Weights dtype the target ran in (``bfloat16``, ``float32``, ...)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"TargetIdentity.{name} must be positive, got {getattr(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetIdentity:
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if not isinstance(d, dict) or n not in d]
        if missing:
            raise ConfigError(f"target identity lacks {missing}; it needs {names} "
                              "(re-create it with `osprey train convert` or `osprey data build`)")
        return cls(**{n: d[n] for n in names})


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


def identify_target(model: Any, tokenizer: Any, name_or_path: str) -> TargetIdentity:
    """Describe ``model`` + ``tokenizer`` as a :class:`TargetIdentity` with stable hashes."""
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

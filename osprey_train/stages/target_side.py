"""What Stage 3 needs to know about the target: identity, tap layers and tokenizer.

They come from a feature store's manifest (``--store``: the taps the store was built with, and the
target's tokenizer from ``--target`` or the store's ``target.name_or_path``) or from the target
model itself (``--target``: :func:`~osprey_data.target_model.identify_target` and the default taps
unless ``--taps``). Shared by the Osprey conversion and the EAGLE-3 initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osprey_data.errors import ConfigError, InputError, ManifestMismatchError
from osprey_data.store import StoreReader
from osprey_data.target_model import (TapLayers, TargetIdentity, default_tap_layers, identify_target, load_hf_target,
                                split_gguf, tokenizer_hash)

__all__ = ["TargetSide", "resolve_target_side", "load_tokenizer"]


@dataclass(kw_only=True)
class TargetSide:
    """Everything convert needs to know about the target."""

    identity: TargetIdentity
    """Which target (sizes and hashes)."""
    taps: TapLayers
    """The hidden states the drafter will read."""
    tokenizer: Any
    """The target tokenizer."""
    model: Any | None = None
    """The loaded target model (only when --target named a model)."""


def load_tokenizer(path: str) -> Any:
    """A tokenizer from a folder, or from a .gguf file's metadata (without dequantizing weights)."""
    from transformers import AutoTokenizer

    folder, gguf = split_gguf(path, None)
    kwargs = {"gguf_file": gguf} if gguf is not None else {}
    try:
        return AutoTokenizer.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"cannot load a tokenizer from {folder!r}: {exc}") from None


def resolve_target_side(*, target: str | None, store: str | None, taps: tuple[int, ...] | None,
                        need_model: bool = False) -> TargetSide:
    """Identity, taps and tokenizer of the target from the store manifest and/or the target."""
    if store is not None:
        header = StoreReader(store).header
        source = target or header.target.name_or_path
        model = None
        if need_model:
            model, tokenizer = load_hf_target(source)
            mine = identify_target(model, tokenizer, source)
            if mine.config_hash != header.target.config_hash:
                raise ManifestMismatchError(
                    f"target {source!r} is not the model store {store} was built with "
                    f"(config hash {mine.config_hash[:12]} != {header.target.config_hash[:12]})"
                )
        else:
            # Only the tokenizer matters here (token ids); no need to load a large target.
            if not Path(source).exists():
                raise InputError(f"store {store} was built for target {source!r}, which is not a local folder; "
                                 "pass --target with a local copy of that target (or its tokenizer)")
            tokenizer = load_tokenizer(source)
        if tokenizer_hash(tokenizer) != header.target.tokenizer_hash:
            raise ManifestMismatchError(
                f"tokenizer of {source!r} differs from the one store {store} was built with "
                "(tokenizer hash mismatch); pass --target with the store's target"
            )
        return TargetSide(identity=header.target, taps=header.taps, tokenizer=tokenizer, model=model)
    model, tokenizer = load_hf_target(target)
    identity = identify_target(model, tokenizer, target)
    tap_layers = TapLayers(layer_ids=taps) if taps is not None else default_tap_layers(identity.num_layers)
    try:
        tap_layers.check_target(identity.num_layers)
    except ConfigError as exc:
        raise ConfigError(f"convert --taps: {exc}") from None
    return TargetSide(identity=identity, taps=tap_layers, tokenizer=tokenizer, model=model)

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

from osprey_data.errors import InputError, ManifestMismatchError
from osprey_data.store import StoreReader
from osprey_data.target_model import (TapLayers, TargetIdentity, default_tap_layers, identify_target, load_hf_target,
                                      peek_model_config, split_gguf, tokenizer_hash)

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


def _check_sizes_match_store(source: str, header: Any, store: str) -> None:
    """The target's config.json sizes against the target the store was built with (before loading)."""
    shape = peek_model_config(source, option="--target")
    if shape is None:
        return
    differ = [f"{name} {mine} vs {theirs}" for name, mine, theirs in (
        ("num_hidden_layers", shape.num_layers, header.target.num_layers),
        ("hidden_size", shape.hidden_size, header.target.hidden_size),
        ("vocab_size", shape.vocab_size, header.target.vocab_size)) if mine is not None and mine != theirs]
    if differ:
        raise ManifestMismatchError(f"--target {source} is not the model store {store} was built with "
                                    f"({shape.path} vs the store's header: {'; '.join(differ)}); pass --target "
                                    "with the store's target")


def _check_tokenizer(tokenizer: Any, source: str, header: Any, store: str) -> None:
    if tokenizer_hash(tokenizer) != header.target.tokenizer_hash:
        raise ManifestMismatchError(
            f"tokenizer of {source!r} differs from the one store {store} was built with "
            "(tokenizer hash mismatch); pass --target with the store's target"
        )


def resolve_target_side(*, target: str | None, store: str | None, taps: tuple[int, ...] | None,
                        need_model: bool = False) -> TargetSide:
    """Identity, taps and tokenizer of the target from the store manifest and/or the target.

    What needs no weights is checked before the target loads: its config.json sizes (against the
    store's header, or ``taps`` against its layers) and its tokenizer (against the store's hash).
    """
    if store is not None:
        header = StoreReader(store).header
        source = target or header.target.name_or_path
        model = None
        if need_model:
            _check_sizes_match_store(source, header, store)
            _check_tokenizer(load_tokenizer(source), source, header, store)
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
            _check_tokenizer(tokenizer, source, header, store)
        return TargetSide(identity=header.target, taps=header.taps, tokenizer=tokenizer, model=model)
    shape = peek_model_config(target, option="--target")
    if shape is not None and shape.num_layers is not None:   # the same checks as below, before loading
        _target_taps(taps, shape.num_layers, source=shape.path)
    model, tokenizer = load_hf_target(target)
    identity = identify_target(model, tokenizer, target)
    return TargetSide(identity=identity, taps=_target_taps(taps, identity.num_layers), tokenizer=tokenizer,
                      model=model)


def _target_taps(taps: tuple[int, ...] | None, num_layers: int, *, source: str | None = None) -> TapLayers:
    """``--taps`` (or the default taps) of a target of ``num_layers`` layers."""
    if taps is None:
        return default_tap_layers(num_layers)
    return TapLayers.for_target(taps, num_layers, option="convert --taps", source=source)

"""The one check that a drafter may run on a target's features: a store's or a live target's.

A drafter is converted for one target: its embedding and LM head index that target's vocabulary,
its fc / W_c reads ``num_taps`` states of width Dt, and it was trained on states tapped at fixed
layers. :func:`check_compatible` compares the drafter's view of its target with a target
identity — the header of a store it is about to train or be evaluated on, or the identity of a
target loaded for live decoding — and raises one :class:`ModelError` listing every difference.
:func:`check_fits_target_config` runs the same check against the sizes in the target's
``config.json`` before either model loads (the hashes need the loaded target, so they wait).
"""

from __future__ import annotations

from typing import Protocol

from osprey_data.errors import ModelError
from osprey_data.target_model.identity import TargetIdentity
from osprey_data.target_model.model_config import peek_model_config
from osprey_data.target_model.taps import TapLayers

__all__ = ["check_compatible", "check_fits_target_config", "DrafterTargetSpec", "TargetSizes"]

# Identity fields that name the exact target; sizes are checked separately above them.
_IDENTITY_HASHES = ("config_hash", "tokenizer_hash")


class DrafterTargetSpec(Protocol):
    """What a drafter config says about the target it serves (``DrafterConfig`` satisfies it)."""

    vocab_size: int
    target_hidden_size: int
    tap_layers: TapLayers
    target: TargetIdentity | None


class TargetSizes(Protocol):
    """The sizes a drafter must fit: a :class:`TargetIdentity` or a config's ``ModelShape`` (whose
    sizes may be unknown, None: those are not compared)."""

    vocab_size: int | None
    hidden_size: int | None
    num_layers: int | None


def check_compatible(drafter: DrafterTargetSpec, target: TargetSizes, *, where: str,
                     taps: TapLayers | None = None, check_identity: bool = True,
                     hint: str = "convert the drafter for this target or use a store built from it") -> None:
    """Raise when ``drafter`` cannot run on features of ``target``.

    Args:
        drafter: the drafter's config (sizes, taps and the identity it was converted for).
        target: the identity of the store's or the live target.
        where: what is being checked, quoted first in the error (command, folder, store).
        taps: the taps the features were captured at (a store's header): must equal the
            drafter's. Without them (a live target) the drafter's taps must exist in the target.
        check_identity: also require the drafter's recorded config and tokenizer hashes to match.
        hint: what the user should do, appended to the error.

    Raises:
        ModelError: naming every difference found.
    """
    problems = []
    if target.vocab_size is not None and drafter.vocab_size != target.vocab_size:
        problems.append(f"vocab_size drafter {drafter.vocab_size} vs target {target.vocab_size}")
    if target.hidden_size is not None and drafter.target_hidden_size != target.hidden_size:
        problems.append(f"target_hidden_size drafter {drafter.target_hidden_size} vs target {target.hidden_size}")
    mine = list(drafter.tap_layers.layer_ids)
    if taps is not None:
        if drafter.tap_layers.num_taps != taps.num_taps:
            problems.append(f"num_taps drafter {drafter.tap_layers.num_taps} vs store {taps.num_taps}")
        if mine != list(taps.layer_ids) or drafter.tap_layers.convention != taps.convention:
            problems.append(f"tap layers drafter {mine} vs store {list(taps.layer_ids)}")
    outside = [i for i in mine if target.num_layers is not None and not 0 <= i <= target.num_layers]
    if outside:
        problems.append(f"tap layers {outside} outside the target's 0..{target.num_layers}")
    if check_identity and drafter.target is not None and isinstance(target, TargetIdentity):
        for key in _IDENTITY_HASHES:
            ours, theirs = getattr(drafter.target, key), getattr(target, key)
            if ours and ours != theirs:
                problems.append(f"target {key} drafter {ours[:12]} vs {theirs[:12]}")
    if problems:
        raise ModelError(f"{where}: the drafter was converted for another target ({'; '.join(problems)}); {hint}")


def check_fits_target_config(drafter: DrafterTargetSpec, target: str, gguf_file: str | None = None, *,
                             where: str, option: str = "--target",
                             hint: str = "convert the drafter for this target") -> None:
    """:func:`check_compatible` of ``drafter`` against the sizes in ``target``'s config alone, so
    that a drafter of another target is refused before either model's weights load; nothing is
    checked when the config cannot be read without loading (a hub id).

    Raises:
        ModelError: naming every size that differs and the config file it was read from.
        InputError: a local ``target`` is missing or has no config.json.
    """
    shape = peek_model_config(target, gguf_file, option=option)
    if shape is not None:
        check_compatible(drafter, shape, where=f"{where} (target sizes from {shape.path})", check_identity=False,
                         hint=hint)

"""Which target hidden states a drafter reads, and how each serving engine numbers them.

Osprey numbers taps in the HF ``output_hidden_states`` convention: index 0 is the embedding
output, index i (>= 1) the output of decoder layer i-1, i.e. the residual stream entering layer i.
The engines number the same states differently, and :class:`TapLayers` converts both ways:

=====================  ========================================  ==========================
engine                 what its id j means                       id for our tap i
=====================  ========================================  ==========================
HF ``hidden_states``   ``hidden_states[j]``                      i
SGLang aux layer ids   output of decoder layer j                 i - 1
vLLM aux layer ids     ``hidden + residual`` entering layer j    i
=====================  ========================================  ==========================

SGLang's ``set_eagle3_layers_to_capture`` adds 1 to explicit ids and captures the residual
stream entering that layer, hence the minus one; vLLM captures before running layer j, which is
``hidden_states[j]`` already.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from osprey_data.errors import ConfigError

__all__ = ["TapLayers", "TAP_CONVENTIONS", "default_tap_layers", "parse_taps"]

TAP_CONVENTIONS = ("hf_hidden_states",)


@dataclass(frozen=True, kw_only=True)
class TapLayers:
    """Which target hidden states are tapped, with the indexing convention stated.

    Valid ids are strictly increasing and within ``1 .. L-1`` for a target of ``L`` layers
    (:meth:`check_target`): engines capture taps in ascending layer order (another order would
    silently permute the drafter's fc / W_c inputs when served), ``hidden_states[0]`` is not a
    decoder layer's output SGLang can name, and ``hidden_states[L]`` is the final *normed* state.
    """

    layer_ids: tuple[int, ...]
    """Tapped ``hidden_states`` indices, in the order their states are concatenated."""
    convention: str = "hf_hidden_states"
    """How ``layer_ids`` count; only ``hf_hidden_states`` (see the module docstring)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_ids", tuple(int(i) for i in self.layer_ids))
        ids = list(self.layer_ids)
        if not ids:
            raise ConfigError("tap layers: name at least one layer")
        if min(ids) < 1:
            raise ConfigError(f"tap layers {ids}: ids must be >= 1 (0 is the embedding output, not a "
                              "decoder layer's output); choose layers 1 .. L-1")
        if any(b <= a for a, b in zip(ids, ids[1:])):
            raise ConfigError(f"tap layers {ids} must be strictly increasing without duplicates (engines capture "
                              f"taps in ascending layer order); use {sorted(set(ids))}")
        if self.convention not in TAP_CONVENTIONS:
            raise ConfigError(
                f"TapLayers.convention {self.convention!r} is unknown; use one of {TAP_CONVENTIONS}"
            )

    @classmethod
    def checked(cls, layer_ids: Sequence[int], *, where: str) -> "TapLayers":
        """``TapLayers(layer_ids=...)`` with a bad list's error prefixed by ``where`` (the option)."""
        try:
            return cls(layer_ids=tuple(int(i) for i in layer_ids))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def check_target(self, num_layers: int, *, source: str | None = None) -> None:
        """Raise :class:`ConfigError` unless every id lies within ``1 .. num_layers - 1``.

        ``source`` names where ``num_layers`` was read (the target's ``config.json``)."""
        bad = [i for i in self.layer_ids if i > num_layers - 1]
        if bad:
            read = f", per {source}" if source else ""
            raise ConfigError(f"tap layers {list(self.layer_ids)}: {bad} outside 1..{num_layers - 1} for a target "
                              f"of {num_layers} layers{read} (hidden_states[{num_layers}] is the final normed state); "
                              f"choose ids within 1..{num_layers - 1}")

    @classmethod
    def for_target(cls, layer_ids: Sequence[int], num_layers: int, *, option: str,
                   source: str | None = None) -> "TapLayers":
        """The taps ``layer_ids`` given with ``option``, checked to exist in a target of ``num_layers``
        layers; the one check both before loading (``source``: the config.json) and after."""
        taps = cls.checked(layer_ids, where=option)
        try:
            taps.check_target(num_layers, source=source)
        except ConfigError as exc:
            raise ConfigError(f"{option}: {exc}, or leave {option} out for the default taps") from None
        return taps

    @property
    def num_taps(self) -> int:
        """How many states are concatenated (the drafter's fc / W_c reads num_taps * Dt)."""
        return len(self.layer_ids)

    # --- engine conventions ------------------------------------------------------------------

    def to_sglang(self) -> list[int]:
        """Ids for SGLang's draft config ``eagle_aux_hidden_state_layer_ids`` (ours minus one;
        ours are >= 1, so every tap has one)."""
        return [i - 1 for i in self.layer_ids]

    @classmethod
    def from_sglang(cls, ids: Sequence[int]) -> TapLayers:
        """Inverse of :meth:`to_sglang`: SGLang aux-layer ids to our taps (plus one)."""
        return cls(layer_ids=tuple(int(i) + 1 for i in ids))

    def to_vllm(self) -> list[int]:
        """Ids for vLLM's ``eagle_aux_hidden_state_layer_ids`` (the same numbers as ours)."""
        return list(self.layer_ids)

    @classmethod
    def from_vllm(cls, ids: Sequence[int]) -> TapLayers:
        """Inverse of :meth:`to_vllm`."""
        return cls(layer_ids=tuple(int(i) for i in ids))

    # --- JSON ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"layer_ids": list(self.layer_ids), "convention": self.convention}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TapLayers:
        if not isinstance(d, dict) or "layer_ids" not in d:
            raise ConfigError(f"tap layers must be an object with 'layer_ids', got {d!r}")
        return cls(layer_ids=tuple(d["layer_ids"]), convention=d.get("convention", "hf_hidden_states"))


def default_tap_layers(num_layers: int) -> TapLayers:
    """EAGLE-3's default taps ``[2, L//2, L-3]`` (HF ``hidden_states`` convention).

    That is also where SGLang and vLLM capture when no ids are configured. For 4 <= L < 7, where
    the formula repeats a layer, ``[1, L//2, L-1]`` (three distinct layers within ``1 .. L-1``,
    low / middle / high as the formula intends).

    Raises:
        ConfigError: for ``num_layers < 4``: three distinct taps within ``1 .. L-1`` do not exist.
    """
    if num_layers < 4:
        raise ConfigError(f"default taps need a target of at least 4 layers (three distinct layers within "
                          f"1..L-1; target has {num_layers}); pass --taps explicitly")
    if num_layers < 7:
        return TapLayers(layer_ids=(1, num_layers // 2, num_layers - 1))
    return TapLayers(layer_ids=(2, num_layers // 2, num_layers - 3))


def parse_taps(text: str | None) -> tuple[int, ...] | None:
    """``"2,15,27"`` -> (2, 15, 27); None or blank -> None (the default taps).

    The one parser of tap lists written by people (``--taps`` of ``osprey data build`` and
    ``osprey train convert``); whether the ids make a valid tap set is :class:`TapLayers`'s check.
    """
    if text is None or not text.strip():
        return None
    try:
        return tuple(int(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise ConfigError(f"tap layers: expected comma-separated integers like 2,15,27, got {text!r}") from None

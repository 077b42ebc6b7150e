"""Configuration of a drafter (Osprey or EAGLE-3): one frozen dataclass, JSON round-trip, presets.

The config is what ``config.json`` of a drafter checkpoint holds (see
``schemas/drafter-config.v1.json``). It describes the drafter body in the source family's terms
(Llama / Qwen2 / Qwen3 decoder layers), the target it serves (vocabulary, hidden size, tap
layers, identity) and the architecture (``osprey``: N conditioned layers; ``eagle3``: one layer
reading [embedding; fused taps], followed by N - 1 plain layers for the multi-layer control).

The target side is typed: ``tap_layers`` is a :class:`~osprey_data.target_model.TapLayers` (whose
methods give each engine's tap numbering) and ``target`` a
:class:`~osprey_data.target_model.TargetIdentity`; ``num_taps`` is derived from the taps. ``from_dict``
parses the JSON form and still reads configs written with the former ``num_taps`` key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from osprey_data.errors import ConfigError
from osprey_data.target_model import TapLayers, TargetIdentity
from osprey_train.drafters.registry import drafter_spec

__all__ = ["DrafterConfig", "FAMILIES", "PRESETS", "ROPE_TYPES"]

FAMILIES = ("llama", "qwen2", "qwen3")
# rope_scaling["rope_type"] values the re-implemented rotary embedding supports (see layers.py).
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True, kw_only=True)
class DrafterConfig:
    """Shape, family, target and tap layers of one drafter."""

    arch: str = "osprey"
    """A registered architecture (osprey_train/drafters/registry.py): 'osprey' (N source-family layers,
    cond fed to every layer) or 'eagle3' (a layer reading [embedding; cond])."""
    family: str = "llama"
    """Decoder family the layers re-implement: 'llama', 'qwen2' (qkv bias) or 'qwen3' (q/k norm)."""
    num_layers: int = 2
    """Number of decoder layers (eagle3: 1, or more for the parameter-matched control)."""
    hidden_size: int = 64
    """Drafter hidden size D."""
    intermediate_size: int = 128
    """SwiGLU MLP inner size."""
    num_attention_heads: int = 4
    """Query heads H."""
    num_key_value_heads: int = 2
    """Key/value heads (GQA); divides num_attention_heads."""
    head_dim: int = 16
    """Per-head size d."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """Rotary base."""
    rope_scaling: dict | None = None
    """HF-style rotary scaling dict with 'rope_type' (linear/dynamic/llama3/yarn) or None."""
    max_position_embeddings: int = 2048
    """Original context length (used by dynamic/yarn/llama3 scaling)."""
    attention_bias: bool = False
    """Bias on q/k/v projections (always on for qwen2; o_proj gets one for llama/qwen3 too)."""
    qk_norm: bool = False
    """Per-head RMSNorm on q and k before rotary (Qwen3)."""
    vocab_size: int = 384
    """TARGET vocabulary size (embedding rows)."""
    draft_vocab_size: int = 384
    """LM head rows: the draft vocabulary (top-N target tokens, mapped by ``d2t``); osprey:
    == vocab_size for the full vocabulary (no ``d2t``), smaller for a reduced one."""
    target_hidden_size: int = 64
    """Hidden size Dt of the target model's tapped states."""
    tap_layers: TapLayers = field(default_factory=lambda: TapLayers(layer_ids=(2, 3, 4)))
    """Target hidden states concatenated into fuse_taps's input (HF hidden_states numbering)."""
    target: TargetIdentity | None = None
    """The target this drafter was converted for (name, hashes, sizes), or None if unknown."""
    arch_options: dict = field(default_factory=dict)
    """Settings only its architecture has (plain JSON), checked by the arch's ``check_config``; the
    eagle3 has none (``{}``), osprey may say how W_c started (``w_c_init``), a block drafter keeps its block
    size and mask token here."""

    def __post_init__(self) -> None:
        spec = drafter_spec(self.arch)
        if self.family not in FAMILIES:
            raise ConfigError(f"drafter family {self.family!r} is not one of {FAMILIES}")
        for name in ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size",
                     "target_hidden_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"drafter config: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"drafter config: num_attention_heads={self.num_attention_heads} is not a multiple "
                f"of num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"drafter config: head_dim must be even for rotary, got {self.head_dim}")
        if self.draft_vocab_size > self.vocab_size:
            raise ConfigError(
                f"drafter config: draft_vocab_size={self.draft_vocab_size} exceeds the target "
                f"vocab_size={self.vocab_size}"
            )
        if not isinstance(self.arch_options, dict):
            raise ConfigError(f"drafter config: arch_options must be a JSON object, got {self.arch_options!r}")
        spec.check_config(self)
        if self.family == "qwen3" and not self.qk_norm:
            raise ConfigError("drafter config: family 'qwen3' needs qk_norm=True")
        if self.family != "qwen3" and self.qk_norm:
            raise ConfigError(f"drafter config: qk_norm is a qwen3 feature, family is {self.family!r}")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            # Normalise legacy {"type": ...} dicts (transformers 4.x) to the "rope_type" key.
            object.__setattr__(self, "rope_scaling", {**{k: v for k, v in self.rope_scaling.items() if k != "type"},
                                                      "rope_type": rope_type})
            if rope_type not in ROPE_TYPES:
                raise ConfigError(
                    f"drafter config: rope_scaling type {rope_type!r} is not supported; known: {ROPE_TYPES}"
                )
        if not isinstance(self.tap_layers, TapLayers):
            raise ConfigError(f"drafter config: tap_layers must be a TapLayers, got {self.tap_layers!r} "
                              "(DrafterConfig.from_dict parses the JSON form)")
        if self.target is not None and not isinstance(self.target, TargetIdentity):
            raise ConfigError(f"drafter config: target must be a TargetIdentity or None, got {self.target!r} "
                              "(DrafterConfig.from_dict parses the JSON form)")
        if self.target is not None:
            try:
                self.tap_layers.check_target(self.target.num_layers)
            except ConfigError as exc:
                raise ConfigError(f"drafter config: {exc}") from None

    # ------------------------------------------------------------------ derived
    @property
    def num_taps(self) -> int:
        """Number L of tapped target layers concatenated into fuse_taps's input."""
        return self.tap_layers.num_taps

    @property
    def taps_width(self) -> int:
        """Input width of fuse_taps: num_taps * target_hidden_size."""
        return self.num_taps * self.target_hidden_size

    @property
    def o_proj_bias(self) -> bool:
        """Llama and Qwen3 put attention_bias on o_proj too; Qwen2 never does."""
        return self.attention_bias and self.family != "qwen2"

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 always has q/k/v bias; the others follow attention_bias."""
        return self.family == "qwen2" or self.attention_bias

    # ------------------------------------------------------------------ io
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dict of every field (what config.json stores, minus format keys)."""
        out = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["tap_layers"] = self.tap_layers.to_dict()
        out["target"] = None if self.target is None else self.target.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DrafterConfig":
        """Build from ``to_dict()`` output; unknown keys raise ConfigError (catches typos).

        A ``num_taps`` key (written before it became derived) is accepted when it agrees with
        ``tap_layers``.
        """
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)}
        legacy_num_taps = data.pop("num_taps", None)
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"drafter config: unknown field(s) {unknown}; known: {sorted(names)}")
        if "tap_layers" in data:
            try:
                data["tap_layers"] = TapLayers.from_dict(data["tap_layers"])
            except ConfigError as exc:
                raise ConfigError(f"drafter config: {exc}") from None
        if data.get("target") is not None:
            data["target"] = TargetIdentity.from_dict(data["target"])
        config = cls(**data)
        if legacy_num_taps is not None and legacy_num_taps != config.num_taps:
            raise ConfigError(f"drafter config: num_taps={legacy_num_taps} disagrees with tap_layers "
                              f"{list(config.tap_layers.layer_ids)}; fix or drop num_taps")
        return config

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "DrafterConfig":
        """A preset by name (see PRESETS), with optional field overrides."""
        if name not in PRESETS:
            raise ConfigError(f"no drafter preset {name!r}; known: {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> "DrafterConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


# Presets: "tiny" matches the tiny test fixtures (d=64 Llama with the 384-token tokenizer and a
# d=64 target tapped at [2, 3, 4]); the others are the usual shapes for quick experiments.
_TINY_TAPS = TapLayers(layer_ids=(2, 3, 4))
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(arch="osprey", family="llama", num_layers=2, hidden_size=64, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=384,
                 draft_vocab_size=384, target_hidden_size=64, tap_layers=_TINY_TAPS),
    "tiny-qwen3": dict(arch="osprey", family="qwen3", qk_norm=True, num_layers=2, hidden_size=64,
                       intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, vocab_size=384, draft_vocab_size=384, target_hidden_size=64,
                       tap_layers=_TINY_TAPS),
    "tiny-eagle3": dict(arch="eagle3", family="llama", num_layers=1, hidden_size=64,
                        intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, vocab_size=384, draft_vocab_size=128, target_hidden_size=64,
                        tap_layers=_TINY_TAPS),
}

"""Store metadata: the store header, the shard list and the manifest.

These dataclasses are the in-memory form of ``manifest.json`` (schema
``schemas/store-manifest.v1.json``). Every one has ``to_dict``/``from_dict`` that round-trip
exactly through JSON; :func:`parse_manifest` is the single place a manifest read from disk is
checked (JSON syntax, format version, schema), so every reader fails the same clear way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from osprey_data import jsonio
from osprey_data.errors import (ConfigError, FormatVersionError, ManifestMismatchError, SchemaError,
                                StoreCorruptError)
from osprey_data.schema_check import validate
from osprey_data.store.codecs import HIDDEN_CODECS
from osprey_data.target_model import TapLayers, TargetIdentity

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "StoreHeader",
    "ShardInfo",
    "Manifest",
    "canonical_json",
    "header_hash",
    "header_differences",
    "parse_manifest",
]

FORMAT_NAME = "osprey-store"
FORMAT_VERSION = 1


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the form hashes are taken of."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, kw_only=True)
class StoreHeader:
    """Everything in ``manifest.json`` except the shard list; equal headers = same store."""

    target: TargetIdentity
    taps: TapLayers
    topk: int
    hidden_codec: str
    has_final_hidden: bool
    chat_template_hash: str
    generation: dict
    build_fingerprint: str
    build_config: dict
    builder_version: str

    def __post_init__(self) -> None:
        if self.hidden_codec not in HIDDEN_CODECS:
            raise ConfigError(
                f"hidden_codec {self.hidden_codec!r} is unknown; use one of {sorted(HIDDEN_CODECS)}"
            )
        if int(self.topk) <= 0:
            raise ConfigError(f"topk must be positive, got {self.topk}")
        if int(self.topk) > self.target.vocab_size:
            raise ConfigError(f"topk {self.topk} exceeds the target vocab size {self.target.vocab_size}")
        self.taps.check_target(self.target.num_layers)

    @property
    def num_taps(self) -> int:
        return len(self.taps.layer_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.to_dict(),
            "taps": self.taps.to_dict(),
            "topk": int(self.topk),
            "hidden_codec": self.hidden_codec,
            "has_final_hidden": bool(self.has_final_hidden),
            "chat_template_hash": self.chat_template_hash,
            "generation": dict(self.generation),
            "build_fingerprint": self.build_fingerprint,
            "build_config": dict(self.build_config),
            "builder_version": self.builder_version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StoreHeader:
        return cls(
            target=TargetIdentity.from_dict(d["target"]),
            taps=TapLayers.from_dict(d["taps"]),
            topk=int(d["topk"]),
            hidden_codec=d["hidden_codec"],
            has_final_hidden=bool(d["has_final_hidden"]),
            chat_template_hash=d["chat_template_hash"],
            generation=dict(d["generation"]),
            build_fingerprint=d["build_fingerprint"],
            build_config=dict(d["build_config"]),
            builder_version=d["builder_version"],
        )


def header_hash(header: StoreHeader | dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a header: written into every shard and journal."""
    d = header.to_dict() if isinstance(header, StoreHeader) else header
    return hashlib.sha256(canonical_json(d).encode()).hexdigest()


def header_differences(a: StoreHeader, b: StoreHeader) -> list[str]:
    """Dotted names of the fields where two headers differ (for ManifestMismatchError)."""
    out: list[str] = []

    def walk(x: Any, y: Any, prefix: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{prefix}.{k}" if prefix else k)
        elif x != y:
            out.append(f"{prefix} ({x!r} != {y!r})")

    walk(a.to_dict(), b.to_dict(), "")
    return out


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One committed shard as listed in the manifest and in its worker's journal."""

    shard_id: str
    worker: str
    num_samples: int
    num_tokens: int
    num_bytes: int
    commit_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardInfo:
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass(kw_only=True)
class Manifest:
    """The whole ``manifest.json``: header plus the ordered list of visible shards."""

    header: StoreHeader
    shards: list[ShardInfo] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    num_errors: int = 0

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.shards)

    def digest(self) -> str:
        """sha256 naming the store's content: its header and every visible shard's commit hash, in order.
        Two stores with the same digest hold the same samples; a resumed or merged build that adds a
        shard gets a new one."""
        doc = {"header_sha256": header_hash(self.header),
               "shards": [[s.shard_id, s.commit_sha256] for s in self.shards]}
        return hashlib.sha256(canonical_json(doc).encode()).hexdigest()

    def arrays(self) -> dict[str, dict[str, Any]]:
        """Logical per-token arrays of the store with their logical dtype and codec."""
        h = self.header
        out: dict[str, dict[str, Any]] = {
            "hidden": {"per_token_shape": [h.num_taps, h.target.hidden_size],
                       "dtype": "bfloat16", "codec": h.hidden_codec},
            "topk_ids": {"per_token_shape": [h.topk], "dtype": "int32", "codec": "blosc-zstd"},
            "topk_logprobs": {"per_token_shape": [h.topk], "dtype": "float32", "codec": "blosc-zstd"},
        }
        if h.has_final_hidden:
            out["final_hidden"] = {"per_token_shape": [h.target.hidden_size],
                                   "dtype": "bfloat16", "codec": h.hidden_codec}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "header": self.header.to_dict(),
            "header_sha256": header_hash(self.header),
            "arrays": self.arrays(),
            "num_samples": self.num_samples,
            "num_tokens": self.num_tokens,
            "num_errors": int(self.num_errors),
            "shards": [s.to_dict() for s in self.shards],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        return cls(
            header=StoreHeader.from_dict(d["header"]),
            shards=[ShardInfo.from_dict(s) for s in d["shards"]],
            format_version=int(d["format_version"]),
            num_errors=int(d.get("num_errors", 0)),
        )


def parse_manifest(raw: bytes, *, where: str) -> Manifest:
    """Parse and check manifest bytes read from ``where``.

    Raises:
        StoreCorruptError: not JSON. FormatVersionError: newer/unknown version.
        SchemaError: does not match the schema. ManifestMismatchError: inconsistent totals.
    """
    try:
        doc = jsonio.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreCorruptError(f"{where}: manifest is not valid JSON ({exc}); the store is damaged") from None
    if not isinstance(doc, dict):
        raise SchemaError(f"{where}: manifest must be a JSON object")
    version = doc.get("format_version")
    if doc.get("format") not in (None, FORMAT_NAME):
        raise SchemaError(f"{where}: format is {doc.get('format')!r}, expected {FORMAT_NAME!r}")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{where}: store format_version {version} is newer than this Osprey supports "
            f"({FORMAT_VERSION}); upgrade Osprey to read it"
        )
    validate(doc, "store-manifest.v1.json", where=where)
    try:
        manifest = Manifest.from_dict(doc)
    except ConfigError as exc:
        raise SchemaError(f"{where}: invalid store header: {exc}; rebuild the store with valid settings") from None
    if doc["header_sha256"] != header_hash(manifest.header):
        raise ManifestMismatchError(f"{where}: header_sha256 does not match the header; the manifest was edited")
    if doc["num_samples"] != manifest.num_samples or doc["num_tokens"] != manifest.num_tokens:
        raise ManifestMismatchError(f"{where}: num_samples/num_tokens disagree with the shard list")
    ids = [s.shard_id for s in manifest.shards]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise StoreCorruptError(f"{where}: lists shard(s) {twice} more than once; every sample would be served "
                                "twice — the manifest was edited or damaged (rerun `osprey data merge`)")
    return manifest

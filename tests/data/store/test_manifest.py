"""Manifest dataclasses, tap-layer conventions and the manifest JSON Schema."""

from __future__ import annotations

import json

import pytest

from osprey_data.errors import ConfigError, SchemaError
from osprey_data.schema_check import validate
from osprey_data.store import Manifest, ShardInfo, StoreHeader
from osprey_data.store.manifest import header_differences, parse_manifest
from tests.data.store.helpers import make_header


def _manifest() -> Manifest:
    info = ShardInfo(shard_id="w000of001-000000", worker="w000of001", num_samples=2, num_tokens=30,
                     num_bytes=1234, commit_sha256="a" * 64)
    return Manifest(header=make_header("fp8", final_hidden=True), shards=[info])


def test_roundtrip_and_schema():
    m = _manifest()
    d = json.loads(json.dumps(m.to_dict()))
    validate(d, "store-manifest.v1.json", where="test")
    m2 = parse_manifest(json.dumps(d).encode(), where="test")
    assert m2.to_dict() == m.to_dict() and m2.header == m.header
    assert StoreHeader.from_dict(m.header.to_dict()) == m.header
    assert d["arrays"]["final_hidden"]["per_token_shape"] == [64]
    assert d["header"]["taps"]["convention"] == "hf_hidden_states"


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["header"]["taps"].update(convention="sglang"), "convention"),
    (lambda d: d["shards"][0].update(shard_id="../../etc"), "shard_id"),
    (lambda d: d["header"].update(hidden_codec="int4"), "hidden_codec"),
    (lambda d: d.pop("arrays"), "arrays"),
])
def test_schema_rejects_bad_manifests(mutate, match):
    d = _manifest().to_dict()
    mutate(d)
    with pytest.raises(SchemaError, match=match):
        parse_manifest(json.dumps(d).encode(), where="x/manifest.json")


def test_header_checks_and_differences():
    with pytest.raises(ConfigError, match="hidden_codec"):
        make_header("int4")
    a, b = make_header(), make_header(config_hash="zzz")
    assert header_differences(a, a) == []
    assert header_differences(a, b)[0].startswith("target.config_hash")


@pytest.mark.parametrize("layer_ids, match", [
    ([3, 2, 4], "strictly increasing"),
    ([2, 2, 4], "strictly increasing"),
    ([0, 2, 4], ">= 1"),
    ([2, 3, 6], "outside 1..5"),  # the target has 6 layers: hidden_states[6] is the final normed state
])
def test_store_header_with_bad_taps_is_refused_naming_the_file(layer_ids, match):
    d = _manifest().to_dict()
    d["header"]["taps"]["layer_ids"] = layer_ids
    with pytest.raises(SchemaError, match=f"x/manifest.json: invalid store header: .*{match}"):
        parse_manifest(json.dumps(d).encode(), where="x/manifest.json")

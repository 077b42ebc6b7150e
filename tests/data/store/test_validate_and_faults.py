"""Bad input and faults: corrupted/truncated chunks, wrong or missing manifests, foreign shards,
newer format versions, bad values — each a clear Osprey error or a validate report naming
shard and sample; plus the validate / inspect / merge CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.errors import (
    FormatVersionError, ManifestMismatchError, SchemaError, StoreCorruptError, StoreNotFoundError,
)
from osprey_data.store import StoreReader, StoreWriter, inspect_store, validate_store
from tests.data.store.helpers import make_header, make_record


def _store(path: Path, n=8, codec="bf16", **kw) -> str:
    with StoreWriter(str(path), make_header(codec, **kw), shard_max_tokens=10_000) as w:
        for i in range(n):
            w.add(make_record(i, T=20, final_hidden=kw.get("final_hidden", False)))
    return str(path)


def _chunk(path: Path, array="hidden_hi") -> Path:
    shard = next(p for p in (path / "shards").iterdir() if not p.name.startswith("."))
    ndim = 3 if array.startswith("hidden") else 2
    return shard / "tokens.zarr" / array / "c" / Path(*["0"] * ndim)


@pytest.mark.parametrize("array", ["hidden_hi", "hidden_lo", "topk_logprobs"])
def test_corrupted_chunk_caught_by_reader_and_validate(tmp_path, array):
    # hidden_lo is stored as raw zstd blocks: only the CRC can notice a flipped bit there
    url = _store(tmp_path / "s")
    chunk = _chunk(tmp_path / "s", array)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptError, match=r"w000of001-000000.*CRC32"):
        StoreReader(url).sample(3)
    report = validate_store(url)
    assert not report.ok
    assert "shard w000of001-000000" in str(report.problems[0]) and "CRC32" in str(report.problems[0])


def test_truncated_chunk_and_missing_file(tmp_path):
    url = _store(tmp_path / "s")
    chunk = _chunk(tmp_path / "s", "topk_ids")
    chunk.write_bytes(chunk.read_bytes()[:10])
    with pytest.raises(StoreCorruptError, match="truncated"):
        StoreReader(url).sample(0)
    chunk.unlink()
    with pytest.raises(StoreCorruptError, match="missing"):
        StoreReader(url).sample(0)
    assert not validate_store(url).ok


def test_missing_and_wrong_manifest(tmp_path):
    with pytest.raises(StoreNotFoundError, match="nothing: does not exist"):
        StoreReader(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreNotFoundError, match="no manifest.json"):
        StoreReader(str(tmp_path / "empty"))
    url = _store(tmp_path / "s")
    mf = tmp_path / "s" / "manifest.json"
    good = mf.read_text()
    mf.write_text("{not json")
    with pytest.raises(StoreCorruptError, match="not valid JSON"):
        StoreReader(url)
    doc = json.loads(good)
    del doc["header"]["topk"]
    mf.write_text(json.dumps(doc))
    with pytest.raises(SchemaError, match="manifest.json.*topk"):
        StoreReader(url)
    doc = json.loads(good)
    doc["format_version"] = 2
    mf.write_text(json.dumps(doc))
    with pytest.raises(FormatVersionError, match="newer"):
        StoreReader(url)
    report = validate_store(url)
    assert not report.ok and "format_version 2" in str(report.problems[0])
    doc = json.loads(good)
    doc["header"]["topk"] = 4  # edited header: hash no longer matches
    mf.write_text(json.dumps(doc))
    with pytest.raises(ManifestMismatchError, match="header_sha256"):
        StoreReader(url)


def test_shard_from_another_target_is_rejected(tmp_path):
    url = _store(tmp_path / "s")
    other = _store(tmp_path / "o", config_hash="another-target")
    shard = "w000of001-000000"
    shutil.rmtree(tmp_path / "s" / "shards" / shard)
    shutil.copytree(tmp_path / "o" / "shards" / shard, tmp_path / "s" / "shards" / shard)
    # a careless copy that also updated the checksum in the manifest
    mf = tmp_path / "s" / "manifest.json"
    doc = json.loads(mf.read_text())
    doc["shards"][0]["commit_sha256"] = json.loads((tmp_path / "o" / "manifest.json").read_text())["shards"][0]["commit_sha256"]
    mf.write_text(json.dumps(doc))
    with pytest.raises(ManifestMismatchError, match="different target"):
        StoreReader(url).sample(0)
    assert "different target" in str(validate_store(url).problems[0])
    assert other


def test_validate_reports_bad_values_by_sample(tmp_path, monkeypatch):
    import osprey_data.store.writer as writer_mod

    monkeypatch.setattr(writer_mod, "check_record", lambda *a, **k: None)  # let bad data through
    recs = [make_record(i, T=10) for i in range(4)]
    recs[2].hidden_TLD[3, 1, 5] = np.inf
    recs[3].topk_ids_TK[0, 0] = 10_000
    recs[1].token_ids[0] = 99_999
    with StoreWriter(str(tmp_path / "s"), make_header()) as w:
        for r in recs:
            w.add(r)
    report = validate_store(str(tmp_path / "s"))
    text = "\n".join(map(str, report.problems))
    assert "sample 'sample-00002': hidden has NaN/Inf" in text
    assert "sample 'sample-00003': topk_ids outside" in text
    assert "sample 'sample-00001': token id outside" in text
    assert "sample-00000" not in text


def test_inspect_reports_sizes_and_domains(tmp_path):
    url = _store(tmp_path / "s", n=9, codec="fp8", final_hidden=True)
    info = inspect_store(url)
    assert info["num_samples"] == 9 and info["num_tokens"] == 180
    assert info["domains"] == {"chat": {"samples": 3, "tokens": 60}, "code": {"samples": 3, "tokens": 60},
                               "math": {"samples": 3, "tokens": 60}}
    assert set(info["arrays"]) == {"hidden", "topk_ids", "topk_logprobs", "final_hidden"}
    h = info["arrays"]["hidden"]
    assert h["raw_bytes_per_token"] == 3 * 64 * 2 and h["compression_ratio"] > 1.2  # fp8 < bf16
    assert info["taps"]["vllm_ids"] == [2, 3, 5] and info["taps"]["sglang_ids"] == [1, 2, 4]
    assert info["target"]["config_hash"] == "cfg"


def test_cli_validate_inspect_merge(tmp_path):
    runner = CliRunner()
    url = _store(tmp_path / "s")
    res = runner.invoke(cli, ["data", "validate", url])
    assert res.exit_code == 0 and "OK" in res.output
    res = runner.invoke(cli, ["data", "inspect", url, "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["num_samples"] == 8
    res = runner.invoke(cli, ["data", "inspect", url])
    assert res.exit_code == 0 and "bytes/token" in res.output and "SGLang ids" in res.output
    res = runner.invoke(cli, ["data", "merge", url])
    assert res.exit_code == 0 and "8 samples" in res.output
    chunk = _chunk(tmp_path / "s")
    chunk.write_bytes(b"garbage")
    res = runner.invoke(cli, ["data", "validate", url])
    assert res.exit_code == 1 and "w000of001-000000" in res.output and "problem" in res.output
    res = runner.invoke(cli, ["data", "inspect", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "error:" in res.output and "Traceback" not in res.output

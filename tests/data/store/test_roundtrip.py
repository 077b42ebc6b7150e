"""Writer -> reader round trips: exact bf16, final hidden, tables, memory://, zarr interop."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import torch

from osprey_data.errors import ManifestMismatchError, SampleNotFoundError, StoreReadOnlyError, InputError
from osprey_data.store import StoreReader, StoreWriter, validate_store
from tests.data.store.helpers import D, TAPS, bf16_round, make_header, make_record


def _write(url, records, header, **kw):
    with StoreWriter(url, header, **kw) as w:
        for r in records:
            w.add(r)
    return url


@pytest.mark.parametrize("codec", ["bf16-blosc", "bf16"])
def test_bf16_roundtrip_exact_and_random_access(tmp_path, codec):
    recs = [make_record(i, final_hidden=True) for i in range(25)]
    _write(str(tmp_path / "s"), recs, make_header(codec, final_hidden=True), shard_max_tokens=60)
    r = StoreReader(str(tmp_path / "s"))
    assert len(r) == 25 and r.num_tokens == sum(len(x.token_ids) for x in recs)
    assert r.num_shards > 3  # several shards, so shard lookup is exercised
    for i in [0, 24, 7, 13, -1]:
        s, ref = r.sample(i), recs[i]
        assert s.sample_id == ref.sample_id and s.index == i % 25
        assert s.token_ids.dtype == np.int32 and np.array_equal(s.token_ids, ref.token_ids)
        assert s.loss_mask.dtype == bool and np.array_equal(s.loss_mask, ref.loss_mask)
        assert s.hidden_TLD.dtype == np.float32
        np.testing.assert_array_equal(s.hidden_TLD, bf16_round(ref.hidden_TLD))
        np.testing.assert_array_equal(s.final_hidden_TD, bf16_round(ref.final_hidden_TD))
        np.testing.assert_array_equal(s.topk_ids_TK, ref.topk_ids_TK)
        np.testing.assert_array_equal(s.topk_logprobs_TK, ref.topk_logprobs_TK)
        assert s.conversation == ref.conversation and s.prompt_length == ref.prompt_length
    assert [s.sample_id for s in r.iter_samples()] == [x.sample_id for x in recs]
    with pytest.raises(IndexError):
        r.sample(25)


@pytest.mark.parametrize("codec", ["bf16-blosc", "bf16"])
def test_torch_bf16_input_is_stored_bit_exactly(tmp_path, codec):
    rec = make_record(0, T=9)
    h = torch.randn(9, len(TAPS), D, dtype=torch.float32).mul(3).to(torch.bfloat16)
    h[0, 0, :4] = torch.tensor([float("-0.0"), 1e-40, -3.0e38, 26624.0])  # signed zero, subnormal, extremes
    rec.hidden_TLD = h
    _write(str(tmp_path / "s"), [rec], make_header(codec))
    s = StoreReader(str(tmp_path / "s")).sample(0, as_torch=True)
    assert s.hidden_TLD.dtype == torch.bfloat16
    assert torch.equal(s.hidden_TLD.view(torch.int16), h.view(torch.int16))  # bit-exact
    assert s.token_ids.dtype == torch.int32 and s.loss_mask.dtype == torch.bool
    assert s.topk_logprobs_TK.dtype == torch.float32


def test_table_index_of_and_domains(tmp_path):
    recs = [make_record(i) for i in range(10)]
    _write(str(tmp_path / "s"), recs, make_header(), shard_max_tokens=40)
    r = StoreReader(str(tmp_path / "s"))
    t = r.table()
    for col in ("sample_id", "domain", "source", "token_ids", "loss_mask", "num_tokens", "row_offset",
                "prompt_length", "finish_reason", "conversation", "shard_id", "index"):
        assert col in t.column_names
    assert t.column("sample_id").to_pylist() == [x.sample_id for x in recs]
    assert r.table(["domain"]).column_names == ["domain"]
    assert r.index_of("sample-00007") == 7
    with pytest.raises(SampleNotFoundError):
        r.index_of("nope")
    with pytest.raises(KeyError):  # SampleNotFoundError is a KeyError too
        r.index_of("nope")


def test_memory_fsspec_store():
    url = "memory://osprey-test/store-a"
    recs = [make_record(i, final_hidden=True) for i in range(6)]
    _write(url, recs, make_header("fp8", final_hidden=True), shard_max_tokens=30)
    r = StoreReader(url)
    assert len(r) == 6
    np.testing.assert_array_equal(r.sample(3).token_ids, recs[3].token_ids)
    assert validate_store(url).ok
    # resume on an object store
    w = StoreWriter(url, make_header("fp8", final_hidden=True), shard_max_tokens=30)
    assert w.done_sample_ids() == {x.sample_id for x in recs}
    w.close()


def test_reader_is_read_only(tmp_path):
    root = tmp_path / "s"
    _write(str(root), [make_record(i) for i in range(4)], make_header())
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    for p in root.rglob("*"):  # a read-only share
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    root.chmod(0o555)
    try:
        r = StoreReader(str(root))
        list(r.iter_samples())
        r.table()
        with pytest.raises(StoreReadOnlyError):
            r.fs.write_atomic("manifest.json", b"{}")
        assert validate_store(str(root)).ok
    finally:
        for p in [root, *root.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_zarr_package_reads_our_arrays(tmp_path):
    """Both lossless layouts are plain Zarr v3 arrays: the default one-array bf16-blosc and
    the byte planes of bf16 (older stores)."""
    import zarr

    recs = [make_record(i, T=50) for i in range(5)]
    _write(str(tmp_path / "b"), recs, make_header("bf16-blosc"))
    shard = StoreReader(str(tmp_path / "b")).manifest.shards[0].shard_id
    bits = zarr.open_group(str(tmp_path / "b" / "shards" / shard / "tokens.zarr"), mode="r")["hidden"][:]
    assert bits.dtype == np.uint16 and bits.shape == (250, len(TAPS), D)
    ref = np.concatenate([bf16_round(x.hidden_TLD) for x in recs])
    np.testing.assert_array_equal((bits.astype(np.uint32) << 16).view(np.float32), ref)

    _write(str(tmp_path / "s"), recs, make_header("bf16"))
    r = StoreReader(str(tmp_path / "s"))
    shard = r.manifest.shards[0].shard_id
    g = zarr.open_group(str(tmp_path / "s" / "shards" / shard / "tokens.zarr"), mode="r")
    hi, lo = g["hidden_hi"][:], g["hidden_lo"][:]
    assert hi.dtype == np.uint8 and hi.shape == (250, len(TAPS), D) and lo.shape == hi.shape
    bits = (hi.astype(np.uint32) << 24) | (lo.astype(np.uint32) << 16)
    ref = np.concatenate([bf16_round(x.hidden_TLD) for x in recs])
    np.testing.assert_array_equal(bits.view(np.float32), ref)
    np.testing.assert_array_equal(g["topk_ids"][:], np.concatenate([x.topk_ids_TK for x in recs]))


def test_header_mismatch_names_the_field(tmp_path):
    _write(str(tmp_path / "s"), [make_record(0)], make_header())
    with pytest.raises(ManifestMismatchError, match="target.config_hash"):
        StoreWriter(str(tmp_path / "s"), make_header(config_hash="other"))
    with pytest.raises(ManifestMismatchError, match="hidden_codec"):
        StoreWriter(str(tmp_path / "s"), make_header("fp8"))


def test_bad_records_are_rejected_with_sample_id(tmp_path):
    with StoreWriter(str(tmp_path / "s"), make_header()) as w:
        bad = make_record(0)
        bad.hidden_TLD = bad.hidden_TLD[:, :2]
        with pytest.raises(InputError, match="sample-00000.*hidden_TLD shape"):
            w.add(bad)
        bad = make_record(1)
        bad.hidden_TLD[0, 0, 0] = np.nan
        with pytest.raises(InputError, match="NaN"):
            w.add(bad)
        bad = make_record(2)
        bad.token_ids[0] = 10_000
        with pytest.raises(InputError, match="out of range"):
            w.add(bad)
        w.add(make_record(3))
        with pytest.raises(InputError, match="already added"):
            w.add(make_record(3))
    assert len(StoreReader(str(tmp_path / "s"))) == 1


def test_exception_in_context_does_not_commit_open_shard(tmp_path):
    url = str(tmp_path / "s")
    with pytest.raises(RuntimeError):
        with StoreWriter(url, make_header(), shard_max_tokens=10_000) as w:
            for i in range(3):
                w.add(make_record(i))
            raise RuntimeError("builder crashed")
    assert len(StoreReader(url)) == 0
    assert not [p for p in os.listdir(tmp_path / "s" / "shards")]
    assert validate_store(url).ok

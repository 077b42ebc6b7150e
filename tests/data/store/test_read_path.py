"""The fast read path: samples spanning many chunks, parallel decode (1 vs 2 threads), chunk
buffer recycling, decode-into-``out``, CRC32C on every read and legacy zlib-CRC32 records."""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from osprey_data.errors import ConfigError, StoreCorruptError
from osprey_data.store import HIDDEN_CODECS, StoreReader, StoreWriter, validate_store
from osprey_data.store import zarrio
from tests.data.store.helpers import bf16_round, make_header, make_record


def _write_small_chunks(path: Path, codec: str, monkeypatch, n=12, final_hidden=True) -> list:
    # ~7 rows per hidden chunk (L*D = 192 bytes a row): every sample spans several chunks and
    # the parts of fp8 (codes, scales, outliers) get different chunk grids
    monkeypatch.setattr(zarrio, "CHUNK_TARGET_BYTES", 192 * 7)
    recs = [make_record(i, final_hidden=final_hidden, outliers=True) for i in range(n)]
    with StoreWriter(str(path), make_header(codec, final_hidden=final_hidden), shard_max_tokens=10_000) as w:
        for r in recs:
            w.add(r)
    return recs


def _expected(codec: str, x) -> np.ndarray:
    c = HIDDEN_CODECS[codec]
    return bf16_round(x) if codec.startswith("bf16") else c.decode(c.encode(x))


@pytest.mark.parametrize("codec", ["bf16-blosc", "bf16", "fp8"])
def test_multi_chunk_samples_same_with_1_and_2_threads(tmp_path, monkeypatch, codec):
    recs = _write_small_chunks(tmp_path / "s", codec, monkeypatch)
    r1 = StoreReader(str(tmp_path / "s"), decode_threads=1)
    r2 = StoreReader(str(tmp_path / "s"), decode_threads=2)
    h = r2.shard(0)
    assert h.reader("hidden" + HIDDEN_CODECS[codec].parts(3, 64)[0].suffix).num_chunks() > 20
    # sequential, then a random order (recycled chunk buffers must never leak into outputs)
    order = list(range(len(recs))) + [7, 0, 11, 3, 3, 10, 1]
    outs = []
    for i in order:
        ref = recs[i]
        a, b, t = r1.sample(i), r2.sample(i), r2.sample(i, as_torch=True)
        np.testing.assert_array_equal(a.hidden_TLD, _expected(codec, ref.hidden_TLD))
        np.testing.assert_array_equal(a.final_hidden_TD[:, None],
                                      _expected(codec, ref.final_hidden_TD[:, None]))
        np.testing.assert_array_equal(b.hidden_TLD, a.hidden_TLD)
        np.testing.assert_array_equal(b.final_hidden_TD, a.final_hidden_TD)
        assert t.hidden_TLD.dtype == torch.bfloat16
        assert torch.equal(t.hidden_TLD, torch.from_numpy(a.hidden_TLD).to(torch.bfloat16))
        assert torch.equal(t.final_hidden_TD, torch.from_numpy(a.final_hidden_TD).to(torch.bfloat16))
        outs.append((i, b.hidden_TLD))
    for i, x in outs:  # earlier outputs were not overwritten by later reads
        np.testing.assert_array_equal(x, _expected(codec, recs[i].hidden_TLD))
    assert [s.sample_id for s in r2.iter_samples()] == [x.sample_id for x in recs]
    assert validate_store(str(tmp_path / "s")).ok


def test_bf16_blosc_whole_chunks_decompress_straight_into_the_torch_output(tmp_path, monkeypatch):
    recs = _write_small_chunks(tmp_path / "s", "bf16-blosc", monkeypatch)
    direct = []
    load_into = zarrio.ChunkedArrayReader.load_into

    def spy(self, i, dst):
        direct.append((self.rel_dir, i))
        return load_into(self, i, dst)

    monkeypatch.setattr(zarrio.ChunkedArrayReader, "load_into", spy)
    for threads in (1, 2):
        r = StoreReader(str(tmp_path / "s"), decode_threads=threads)
        for i in [*range(len(recs)), 5, 2]:
            s = r.sample(i, as_torch=True)
            assert torch.equal(s.hidden_TLD, torch.from_numpy(recs[i].hidden_TLD).to(torch.bfloat16))
            assert torch.equal(s.final_hidden_TD, torch.from_numpy(recs[i].final_hidden_TD).to(torch.bfloat16))
    assert {d for d, _ in direct} == {"tokens.zarr/hidden", "tokens.zarr/final_hidden"}
    assert len(direct) > 20


@pytest.mark.parametrize("codec,array", [("bf16", "hidden_lo"), ("bf16-blosc", "hidden")])
@pytest.mark.parametrize("as_torch", [False, True])  # bf16-blosc + torch: straight into the output
def test_corruption_in_a_decode_thread_names_shard_and_sample(tmp_path, monkeypatch, codec, array, as_torch):
    _write_small_chunks(tmp_path / "s", codec, monkeypatch, final_hidden=False)
    shard = next(p for p in (tmp_path / "s" / "shards").iterdir() if not p.name.startswith("."))
    chunk = shard / "tokens.zarr" / array / "c" / "5" / "0" / "0"  # hidden_lo: raw mantissa bytes
    data = bytearray(chunk.read_bytes())
    data[-3] ^= 0x01
    chunk.write_bytes(bytes(data))
    r = StoreReader(str(tmp_path / "s"), decode_threads=2)
    bad = [i for i in range(len(r)) if _raises(r, i, as_torch)]
    assert bad, "the flipped bit was not detected"
    with pytest.raises(StoreCorruptError, match=rf"sample \d+ .*w000of001-000000.*{array}/c/5/0/0.*CRC32C"):
        r.sample(bad[0], as_torch=as_torch)
    report = validate_store(str(tmp_path / "s"))
    assert not report.ok and "CRC32C" in str(report.problems[0])


def _raises(r: StoreReader, i: int, as_torch: bool = False) -> bool:
    try:
        r.sample(i, as_torch=as_torch)
    except StoreCorruptError:
        return True
    return False


def test_commit_records_with_legacy_zlib_crc32_still_verify(tmp_path):
    """Stores written before the switch to CRC32C carry ``crc32``: read and checked."""
    url = str(tmp_path / "s")
    recs = [make_record(i) for i in range(4)]
    with StoreWriter(url, make_header("bf16"), shard_max_tokens=10_000) as w:
        for rec in recs:
            w.add(rec)
    shard = next(p for p in (tmp_path / "s" / "shards").iterdir() if not p.name.startswith("."))
    commit = json.loads((shard / "_COMMIT.json").read_text())
    assert all("crc32c" in f for f in commit["files"].values())
    for rel, f in commit["files"].items():
        commit["files"][rel] = {"bytes": f["bytes"], "crc32": zlib.crc32((shard / rel).read_bytes())}
    raw = json.dumps(commit, indent=1, sort_keys=True).encode()
    (shard / "_COMMIT.json").write_bytes(raw)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["shards"][0]["commit_sha256"] = hashlib.sha256(raw).hexdigest()
    manifest["shards"][0]["num_bytes"] = sum(f["bytes"] for f in commit["files"].values()) + len(raw)
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    r = StoreReader(url)
    np.testing.assert_array_equal(r.sample(2).hidden_TLD, bf16_round(recs[2].hidden_TLD))
    assert validate_store(url).ok
    chunk = shard / "tokens.zarr" / "hidden_lo" / "c" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptError, match=r"fails its CRC32 check"):
        StoreReader(url).sample(0)


def test_commit_entry_without_checksum_is_rejected():
    with pytest.raises(StoreCorruptError, match="no checksum"):
        zarrio.verify_file(b"abc", {"bytes": 3}, where="shard x", rel="f")


def test_decode_threads_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="decode_threads"):
        StoreReader(str(tmp_path / "nothing"), decode_threads=0)


@pytest.mark.parametrize("codec", ["bf16-blosc", "bf16", "fp8"])
def test_codec_decode_into_out(codec):
    c = HIDDEN_CODECS[codec]
    x = make_record(3, T=9, outliers=True).hidden_TLD
    parts = c.encode(x)
    out = np.full(x.shape, np.nan, dtype=np.float32)
    assert c.decode(parts, out=out) is out
    np.testing.assert_array_equal(out, c.decode(parts))
    t = torch.zeros(x.shape, dtype=torch.bfloat16)
    assert c.decode_torch(parts, out=t) is t
    assert torch.equal(t, c.decode_torch(parts))
    with pytest.raises(ValueError, match="shape"):
        c.decode(parts, out=np.empty((1, *x.shape[1:]), dtype=np.float32))


def _child_reads(url: str, q) -> None:
    s = StoreReader(url, decode_threads=2).sample(5)
    q.put(s.hidden_TLD.tobytes())


def test_decode_pool_works_in_a_forked_child(tmp_path, monkeypatch):
    """DataLoader workers fork after the parent already used the decode pool."""
    import multiprocessing as mp

    _write_small_chunks(tmp_path / "s", "bf16", monkeypatch, n=6, final_hidden=False)
    url = str(tmp_path / "s")
    parent = StoreReader(url, decode_threads=2).sample(5).hidden_TLD  # parent's pool is live
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(url, q))
    p.start()
    got = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert got == parent.tobytes()


def test_random_access_keeps_decoded_chunks_of_few_shards(tmp_path):
    """A shuffled epoch visits every shard: only the most recent ones keep their chunk buffers."""
    from osprey_data.store.reader import SHARDS_WITH_CHUNKS

    recs = [make_record(i, T=12) for i in range(40)]
    with StoreWriter(str(tmp_path / "s"), make_header(), shard_max_tokens=30) as w:
        for r in recs:
            w.add(r)
    r = StoreReader(str(tmp_path / "s"))
    assert r.num_shards > 3 * SHARDS_WITH_CHUNKS
    for i in np.random.default_rng(0).permutation(len(recs)).tolist() * 2:
        s = r.sample(i, as_torch=True)
        assert torch.equal(s.hidden_TLD, torch.from_numpy(bf16_round(recs[i].hidden_TLD)).to(torch.bfloat16))
        live = [k for k, h in r._handles.items() if h._readers]
        assert len(live) <= SHARDS_WITH_CHUNKS
    assert len(r._handles) == r.num_shards  # commit records and tables stay

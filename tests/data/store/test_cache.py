"""The local shard cache and prefetch of remote stores, on the S3 endpoint (moto over HTTP)."""

from __future__ import annotations

import fsspec
import pytest

from osprey_data.errors import StoreCorruptError
from osprey_data.store import StoreReader
from osprey_data.store.cache import PREFETCHER, ShardFileCache
from tests.data.store.helpers import check_content, ids, write_records


def test_cache_serves_committed_shards_and_repairs_damaged_copies(s3_url, tmp_path):
    write_records(s3_url, range(10), shard_tokens=40)
    cache_dir = tmp_path / "cache"
    r = StoreReader(s3_url, cache=cache_dir)
    assert r.num_shards >= 3
    r.sample(0)  # opens shard 0: it and shard 1 are prefetched in the background
    assert PREFETCHER.wait(60)
    for k in (0, 1):
        info = r.manifest.shards[k]
        files = r.shard(k).commit["files"]
        assert all(r.cache.has(info, rel) for rel in files), k
    check_content(r, ids(range(10)))  # a full pass caches every shard
    assert PREFETCHER.wait(60)
    # damage one cached chunk: the next reader drops it, fetches it again and reads true values
    info = r.manifest.shards[0]
    chunk = next(p for p in sorted(r.cache.shard_dir(info).rglob("*")) if "hidden_hi/c" in str(p) and p.is_file())
    chunk.write_bytes(b"\0" * chunk.stat().st_size)
    check_content(StoreReader(s3_url, cache=cache_dir), ids(range(10)))
    assert chunk.read_bytes() != b"\0" * chunk.stat().st_size
    # committed shards are immutable: with their objects gone from the bucket, the cache serves them
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.rm(s3_url[len("s3://"):] + "/shards", recursive=True)
    check_content(StoreReader(s3_url, cache=cache_dir), ids(range(10)))
    with pytest.raises(StoreCorruptError, match="missing"):
        StoreReader(s3_url, cache=False).sample(0)


def test_cache_size_limit_evicts_least_recently_used_shards(s3_url, tmp_path):
    write_records(s3_url, range(10), shard_tokens=40)
    total = sum(s.num_bytes for s in StoreReader(s3_url, cache=False).manifest.shards)
    limit = total // 2
    r = StoreReader(s3_url, cache=tmp_path / "cache", prefetch=False)
    r.cache = ShardFileCache(tmp_path / "cache", s3_url, max_bytes=limit)
    check_content(r, ids(range(10)))
    held = sum(f.stat().st_size for f in r.cache.dir.rglob("*") if f.is_file())
    assert held <= limit
    assert r.cache.has(r.manifest.shards[-1], "_COMMIT.json")  # the newest stays
    assert not r.cache.shard_dir(r.manifest.shards[0]).exists()  # the oldest went

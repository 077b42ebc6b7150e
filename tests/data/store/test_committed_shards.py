"""StoreWriter.committed_shards: the public report of what a worker committed, sizes included."""

from __future__ import annotations

from osprey_data.store import StoreReader, StoreWriter
from tests.data.store.helpers import make_header, make_record


def test_committed_shards_report_sizes_and_survive_a_reopen(tmp_path):
    url = str(tmp_path / "store")
    header = make_header()
    with StoreWriter(url, header, shard_max_tokens=20) as writer:
        for i in range(5):
            writer.add(make_record(i, T=9))
    shards = writer.committed_shards()
    assert len(shards) >= 2 and all(s.num_bytes > 0 for s in shards)
    manifest = StoreReader(url).manifest
    assert sorted(shards, key=lambda s: s.shard_id) == manifest.shards
    assert sum(s.num_tokens for s in shards) == manifest.num_tokens == 45
    reopened = StoreWriter(url, header)
    assert reopened.committed_shards() == shards   # read back from the worker's journal
    reopened.close()

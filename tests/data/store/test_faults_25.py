"""Fault-round findings of issue #25 against the store: merge verifies journal entries (item 9),
the shard cache shared by processes (item 10), validate's exit (item 15), lock files (item 17).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from osprey_data.errors import StoreCorruptError
from osprey_data.store import StoreReader, merge_store, validate_store
from tests.data.store.helpers import ids, write_records


# --- item 9: merge publishes only journal entries that match their shard's _COMMIT.json -------

def _two_workers(tmp_path: Path) -> str:
    url = str(tmp_path / "s")
    write_records(url, range(0, 4), worker=0, num_workers=2)
    write_records(url, range(4, 8), worker=1, num_workers=2)
    return url


def test_merge_refuses_a_journal_entry_whose_commit_hash_differs_and_publishes_the_rest(tmp_path):
    url = _two_workers(tmp_path)
    journal = Path(url) / "workers" / "w001of002.json"
    good = journal.read_bytes()
    doc = json.loads(good)
    bad_shard = doc["shards"][0]["shard_id"]
    doc["shards"][0]["commit_sha256"] = "0" * 64
    journal.write_text(json.dumps(doc))
    with pytest.raises(StoreCorruptError, match=rf"worker w001of002.*shard {bad_shard}.*_COMMIT.json"):
        merge_store(url)
    r = StoreReader(url)  # the good worker's shards are visible and readable, the bad one is not
    assert {s.worker for s in r.manifest.shards} == {"w000of002"}
    assert sorted(s.sample_id for s in r.iter_samples()) == ids(range(0, 4))
    journal.write_bytes(good)  # restoring the right journal is enough
    m = merge_store(url)
    assert {s.worker for s in m.shards} == {"w000of002", "w001of002"}
    assert sorted(s.sample_id for s in StoreReader(url).iter_samples()) == ids(range(8))
    assert validate_store(url).ok


def test_merge_refuses_an_entry_whose_shard_commit_is_missing(tmp_path):
    url = _two_workers(tmp_path)
    doc = json.loads((Path(url) / "workers" / "w000of002.json").read_text())
    gone = doc["shards"][-1]["shard_id"]
    shutil.rmtree(Path(url) / "shards" / gone)
    with pytest.raises(StoreCorruptError, match=rf"worker w000of002.*shard {gone}"):
        merge_store(url)
    assert gone not in {s.shard_id for s in StoreReader(url).manifest.shards}
    assert "w001of002" in {s.worker for s in StoreReader(url).manifest.shards}

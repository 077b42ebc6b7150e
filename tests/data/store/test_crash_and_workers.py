"""Crash safety (SIGKILL mid-shard, resume) and lock-free concurrent workers + merge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from osprey_data.errors import ManifestMismatchError, StoreCorruptError
from osprey_data.store import StoreReader, StoreWriter, merge_store, validate_store
from tests.data.store.helpers import check_content, make_header, make_record

ROOT = Path(__file__).resolve().parents[3]


def _spawn(url, start, stop, worker=0, num_workers=1, shard_tokens=60, kill_at=-1):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.data.store._writer_proc", str(url), str(start), str(stop),
         str(worker), str(num_workers), str(shard_tokens), str(kill_at)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_mid_shard_then_resume(tmp_path):
    url = tmp_path / "store"
    p = _spawn(url, 0, 30, kill_at=20)
    _, err = p.communicate(timeout=120)
    assert p.returncode == -9, err
    shards_dir = os.listdir(url / "shards")
    assert any(n.startswith(".tmp-") for n in shards_dir)  # really died mid-shard
    report = validate_store(str(url))
    assert report.ok, report.format()
    assert any("unfinished shard" in n for n in report.notes)
    r = StoreReader(str(url))
    committed = [s.sample_id for s in r.iter_samples()]
    assert 0 < len(committed) < 21
    check_content(r, committed)

    w = StoreWriter(str(url), make_header("bf16"), shard_max_tokens=60)
    assert w.done_sample_ids() == set(committed)
    assert not any(n.startswith(".tmp-") for n in os.listdir(url / "shards"))
    for i in range(30):
        rec = make_record(i)
        if rec.sample_id not in w.done_sample_ids():
            w.add(rec)
    w.close()
    r = StoreReader(str(url))
    check_content(r, [make_record(i).sample_id for i in range(30)])
    assert validate_store(str(url)).ok


def test_committed_but_unjournaled_shard_is_adopted(tmp_path):
    url = str(tmp_path / "store")
    with StoreWriter(url, make_header(), shard_max_tokens=40) as w:
        for i in range(12):
            w.add(make_record(i))
    journal = tmp_path / "store" / "workers" / "w000of001.json"
    doc = json.loads(journal.read_text())
    last = doc["shards"].pop()  # simulate a crash right after the shard's rename
    journal.write_text(json.dumps(doc))
    w = StoreWriter(url, make_header(), shard_max_tokens=40)
    assert len(w.done_sample_ids()) == 12
    w.close()
    doc2 = json.loads(journal.read_text())
    assert doc2["shards"][-1] == last
    assert len(StoreReader(url)) == 12


def test_two_concurrent_worker_processes_then_merge(tmp_path):
    url = tmp_path / "store"
    StoreWriter(str(url), make_header("bf16"), worker_index=0, num_workers=2).close()  # create
    procs = [_spawn(url, k * 20, (k + 1) * 20, worker=k, num_workers=2, shard_tokens=50) for k in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert len(StoreReader(str(url))) == 0  # invisible until merged
    assert any("not in manifest" in n for n in validate_store(str(url)).notes)
    m = merge_store(str(url))
    assert {s.worker for s in m.shards} == {"w000of002", "w001of002"}
    assert merge_store(str(url)).to_dict() == m.to_dict()  # idempotent
    r = StoreReader(str(url))
    check_content(r, [make_record(i).sample_id for i in range(40)])
    assert validate_store(str(url)).ok


def test_merge_rejects_duplicate_samples_and_foreign_workers(tmp_path):
    url = str(tmp_path / "store")
    for k in (0, 1):
        with StoreWriter(url, make_header(), worker_index=k, num_workers=2) as w:
            w.add(make_record(5))  # both workers processed sample 5
    with pytest.raises(StoreCorruptError, match="sample-00005"):
        merge_store(url)
    url2 = str(tmp_path / "store2")
    StoreWriter(url2, make_header(), worker_index=0, num_workers=2).close()
    # a journal written for another target (copied in by mistake)
    other = str(tmp_path / "other")
    with StoreWriter(other, make_header(config_hash="different"), worker_index=1, num_workers=2) as w:
        w.add(make_record(1))
    os.makedirs(Path(url2) / "workers", exist_ok=True)
    (Path(url2) / "workers" / "w001of002.json").write_bytes((Path(other) / "workers" / "w001of002.json").read_bytes())
    with pytest.raises(ManifestMismatchError, match="w001of002"):
        merge_store(url2)


def test_object_store_partial_shard_is_invisible_and_cleaned_on_resume():
    import fsspec

    url = "memory://osprey-test/crash-obj"
    with StoreWriter(url, make_header(), shard_max_tokens=40) as w:
        for i in range(6):
            w.add(make_record(i))
    fs = fsspec.filesystem("memory")
    # a writer died after writing some files of its next shard (no _COMMIT.json on object stores)
    fs.pipe_file("/osprey-test/crash-obj/shards/w000of001-000099/tokens.zarr/hidden_hi/c/0/0/0", b"partial")
    report = validate_store(url)
    assert report.ok and any("w000of001-000099" in n for n in report.notes)
    assert len(StoreReader(url)) == 6
    w = StoreWriter(url, make_header(), shard_max_tokens=40)
    assert not fs.exists("/osprey-test/crash-obj/shards/w000of001-000099")
    before = {s.shard_id for s in StoreReader(url).manifest.shards}
    w.add(make_record(6))
    w.close()
    after = StoreReader(url)
    assert len(after) == 7 and before < {s.shard_id for s in after.manifest.shards}

"""The store on a real S3 protocol endpoint (moto's server over HTTP, s3fs, IAM-checked users).

Commit atomicity without renames, manifest compare-and-swap under racing merges (also on local
disk and memory://), read-only credentials. A SIGKILLed builder worker and its resume on S3 are
in ``tests/cli/test_shared_store_s3.py``.
"""

from __future__ import annotations

import json
import threading
import time

import fsspec
import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.errors import ConfigError, StoreReadOnlyError
from osprey_data.store import StoreReader, StoreWriter, merge_store, validate_store
from osprey_data.store import journal as journal_mod
from osprey_data.store.fs import StoreFS
from tests.data.store.helpers import check_content, ids, make_header, write_records
from tests.helpers.s3_server import use_identity


def _objects(url: str) -> list[str]:
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    base = url[len("s3://"):]
    return sorted(p[len(base) + 1:] for p in fs.find(base))


def test_write_read_validate_over_http(s3_url):
    write_records(s3_url, range(8), shard_tokens=50)
    objs = _objects(s3_url)
    shards = sorted({o.split("/")[1] for o in objs if o.startswith("shards/")})
    assert len(shards) >= 2 and not any(".tmp-" in o for o in objs)  # no renames on S3
    assert all(f"shards/{s}/_COMMIT.json" in objs for s in shards)
    assert {"manifest.json", "workers/w000of001.json"} <= set(objs)
    check_content(StoreReader(s3_url), ids(range(8)))
    report = validate_store(s3_url)
    assert report.ok and report.num_samples == 8, report.format()


def test_commit_records_are_create_only_on_s3(s3_url):
    write_records(s3_url, range(3))
    fs = StoreFS(s3_url, read_only=False)
    with pytest.raises(FileExistsError):
        fs.write_atomic("shards/w000of001-000000/_COMMIT.json", b"{}", create_only=True)
    assert validate_store(s3_url).ok


@pytest.fixture(params=["s3", "local", "memory"])
def any_url(request, tmp_path):
    if request.param == "s3":
        return request.getfixturevalue("s3_url")
    if request.param == "local":
        return str(tmp_path / "store")
    import uuid

    return f"memory://race-{uuid.uuid4().hex[:8]}/store"


def test_a_merge_that_loses_the_race_retries_instead_of_dropping_shards(any_url, monkeypatch):
    """Merge A reads the store; merge B publishes new shards; A's write must not hide them."""
    StoreWriter(any_url, make_header("bf16"), worker_index=0, num_workers=2).close()
    write_records(any_url, range(0, 6), worker=0, num_workers=2)
    original = StoreFS.replace_if_unchanged
    calls = []

    def racing(self, rel, data, token):
        calls.append(rel)
        if len(calls) == 1:  # A computed its manifest from worker 0 only; B runs in between
            write_records(any_url, range(6, 12), worker=1, num_workers=2)
            merged_b = merge_store(any_url)
            assert {s.worker for s in merged_b.shards} == {"w000of002", "w001of002"}
        return original(self, rel, data, token)

    # a context of its own: monkeypatch.undo() would also drop the store cache s3_url names
    with monkeypatch.context() as patch:
        patch.setattr(StoreFS, "replace_if_unchanged", racing)
        merged_a = merge_store(any_url)
    assert len(calls) == 3  # A, B, A again after its conditional write was refused
    assert {s.worker for s in merged_a.shards} == {"w000of002", "w001of002"}
    check_content(StoreReader(any_url), ids(range(12)))


def test_many_merges_racing_over_http_only_ever_grow_the_manifest(s3_url):
    StoreWriter(s3_url, make_header("bf16"), worker_index=0, num_workers=2).close()
    stop = threading.Event()
    seen: list[list[str]] = []
    errors: list[BaseException] = []

    def merger():
        try:
            while not stop.is_set():
                merge_store(s3_url)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def watcher():
        fs = StoreFS(s3_url, read_only=True)
        while not stop.is_set():
            doc = json.loads(fs.read_bytes("manifest.json"))
            seen.append([s["shard_id"] for s in doc["shards"]])
            time.sleep(0.01)

    threads = [threading.Thread(target=merger) for _ in range(3)] + [threading.Thread(target=watcher)]
    for t in threads:
        t.start()
    try:
        for k in (0, 1):  # two workers keep committing while three merges race
            write_records(s3_url, range(k * 6, k * 6 + 6), worker=k, num_workers=2, shard_tokens=30)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    final = merge_store(s3_url)
    assert final.num_samples == 12 and len(seen) > 10
    for before, after in zip(seen, seen[1:]):  # never a shard hidden again once visible
        assert set(before) <= set(after), (before, after)
    check_content(StoreReader(s3_url), ids(range(12)))


def test_publish_gives_up_loudly_when_always_beaten(tmp_path, monkeypatch):
    url = str(tmp_path / "store")
    write_records(url, range(3))
    monkeypatch.setattr(journal_mod, "PUBLISH_ATTEMPTS", 3)
    monkeypatch.setattr(StoreFS, "replace_if_unchanged", lambda self, rel, data, token: False)
    monkeypatch.setattr(journal_mod.time, "sleep", lambda s: None)
    with pytest.raises(journal_mod.StoreError, match="changed by other processes 3 times"):
        merge_store(url)


def test_read_only_credentials_read_and_validate_but_cannot_write(s3_url, s3_endpoint, monkeypatch):
    write_records(s3_url, range(8))
    use_identity(monkeypatch, s3_endpoint, "reader")
    check_content(StoreReader(s3_url), ids(range(8)))
    assert validate_store(s3_url).ok
    with pytest.raises(StoreReadOnlyError) as err:
        merge_store(s3_url)
    assert s3_url in str(err.value) and "manifest.json" in str(err.value)
    with pytest.raises(StoreReadOnlyError, match="refused to write"):
        StoreWriter(s3_url, make_header("bf16"))
    with pytest.raises(StoreReadOnlyError, match=s3_url):
        StoreFS(s3_url, read_only=False).check_writable()
    res = CliRunner().invoke(cli, ["data", "merge", s3_url])
    assert res.exit_code == 2 and s3_url in res.output and "read" in res.output, res.output
    assert not any(secret in res.output for secret in s3_endpoint.secrets())
    # and nothing was written by the attempts
    use_identity(monkeypatch, s3_endpoint, "writer")
    assert not any(".osprey-write-probe" in o for o in _objects(s3_url))


def test_url_with_embedded_credentials_is_refused():
    with pytest.raises(ConfigError, match="embeds credentials") as err:
        StoreFS("s3://AKIDEXAMPLE:verysecret@bucket/store", read_only=True)
    assert "verysecret" not in str(err.value)

"""Crafted and damaged stores, concurrent writers, and pyarrow's exit abort (issue #12, items 3
and 9-15): nothing hangs, reads outside the store, misleads a reader, or loses data.

Stores are tampered with as an attacker would: files replaced by a FIFO, a directory or a link to
/dev/zero, commit records naming paths outside the store, manifests edited with their checksums
recomputed (:func:`reseal`), so that only the checks under test stand in the way.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
from click.testing import CliRunner
from osprey_cli.main import cli

from osprey_data.errors import StoreCorruptError, StoreError, StoreNotFoundError
from osprey_data.store import StoreReader, StoreWriter, inspect_store, merge_store, validate_store
from osprey_data.store.worker_lock import WorkerBusyError, lock_path
from tests.data.store.helpers import bf16_round, make_header, make_record

ROOT = Path(__file__).resolve().parents[3]
SHARD = "w000of001-000000"


def _store(path: Path, n: int = 6, shard_max_tokens: int = 10_000, **kw) -> str:
    with StoreWriter(str(path), make_header(**kw), shard_max_tokens=shard_max_tokens) as w:
        for i in range(n):
            w.add(make_record(i, T=20))
    return str(path)


def _commit(store: Path, shard: str = SHARD) -> tuple[Path, dict]:
    path = store / "shards" / shard / "_COMMIT.json"
    return path, json.loads(path.read_text())


def reseal(store: Path) -> None:
    """Recompute every checksum the manifest and journals keep of the commit records, as someone
    tampering with a store would: only what the reader itself checks can then catch the edit."""
    manifest = json.loads((store / "manifest.json").read_text())
    for s in manifest["shards"]:
        commit = store / "shards" / s["shard_id"] / "_COMMIT.json"
        s["commit_sha256"] = hashlib.sha256(commit.read_bytes()).hexdigest()
    (store / "manifest.json").write_text(json.dumps(manifest))


def _rewrite(store: Path, rel: str, data: bytes, shard: str = SHARD) -> None:
    """Replace a shard file and its commit entry (size + CRC32C), then reseal."""
    (store / "shards" / shard / rel).write_bytes(data)
    path, doc = _commit(store, shard)
    doc["files"][rel] = {"bytes": len(data), "crc32c": google_crc32c.value(data)}
    path.write_text(json.dumps(doc))
    reseal(store)


def _finishes(fn, timeout: float = 30.0):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it does not return."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} hangs"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _chunk(store: Path, array: str = "topk_ids") -> Path:
    return store / "shards" / SHARD / "tokens.zarr" / array / "c" / "0" / "0"


# --- items 10, 14: FIFO, /dev/zero, directories instead of files -------------------------------

@pytest.mark.parametrize("kind", ["fifo", "dev_zero_link", "directory"])
def test_special_file_instead_of_a_chunk_is_refused_without_hanging(tmp_path, kind):
    url = _store(tmp_path / "s")
    chunk = _chunk(tmp_path / "s")
    chunk.unlink()
    if kind == "fifo":
        os.mkfifo(chunk)
        expect = "is a FIFO, not a regular file"
    elif kind == "dev_zero_link":
        os.symlink("/dev/zero", chunk)
        expect = "is a symbolic link"
    else:
        chunk.mkdir()
        expect = "is a directory, not a regular file"
    with pytest.raises(StoreCorruptError, match=expect):
        _finishes(lambda: StoreReader(url).sample(0))
    report = _finishes(lambda: validate_store(url))
    assert not report.ok and expect in str(report.problems[0])
    report = _finishes(lambda: validate_store(url, check_values=False))
    assert not report.ok and expect in str(report.problems[0])


# --- items 10, 11: commit records naming files outside the store --------------------------------

@pytest.mark.parametrize("target", ["fifo", "secret"])
def test_commit_entry_leaving_the_store_is_never_opened(tmp_path, monkeypatch, target):
    store = tmp_path / "deep" / "er" / "s"
    url = _store(store)
    outside = tmp_path / "outside"
    if target == "fifo":
        os.mkfifo(outside)
    else:
        outside.write_bytes(b"root:secret-hash:19000::::::\n" * 7)
    path, doc = _commit(store)
    rel = "../../../../outside"
    doc["files"][rel] = {"bytes": 5, "crc32c": 0}
    path.write_text(json.dumps(doc))
    reseal(store)
    opened: list[str] = []
    real_open = os.open

    def watch(p, *args, **kwargs):
        opened.append(os.path.realpath(p))
        return real_open(p, *args, **kwargs)

    monkeypatch.setattr(os, "open", watch)
    report = _finishes(lambda: validate_store(url))
    assert not report.ok and "files" in str(report.problems[0]) and "does not match" in str(report.problems[0])
    assert str(outside.resolve()) not in opened
    if target == "secret":
        assert f"{outside.stat().st_size} bytes" not in report.format()
    with pytest.raises(StoreCorruptError):
        _finishes(lambda: StoreReader(url).sample(0))
    assert str(outside.resolve()) not in opened


def test_store_paths_never_leave_the_root(tmp_path):
    from osprey_data.store.fs import StoreFS

    fs = StoreFS(str(tmp_path), read_only=True)
    for bad in ("../x", "shards/../../x", "/etc/passwd", "a//b", "a/./b", "a\\b"):
        with pytest.raises(StoreCorruptError, match="refusing path"):
            fs.read_bytes(bad)
    # a shard folder that is a link out of the store: nothing in it is read
    url = _store(tmp_path / "s")
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(tmp_path / "s" / "shards" / SHARD), elsewhere)
    os.symlink(elsewhere, tmp_path / "s" / "shards" / SHARD)
    with pytest.raises(StoreCorruptError, match="outside the store"):
        StoreReader(url).sample(0)


# --- item 12: readers check what they rely on ---------------------------------------------------

def test_shard_listed_twice_is_refused_at_open(tmp_path):
    url = _store(tmp_path / "s")
    mf = tmp_path / "s" / "manifest.json"
    doc = json.loads(mf.read_text())
    doc["shards"].append(dict(doc["shards"][0]))
    doc["num_samples"] *= 2
    doc["num_tokens"] *= 2
    mf.write_text(json.dumps(doc))
    with pytest.raises(StoreCorruptError, match=f"lists shard\\(s\\) \\['{SHARD}'\\] more than once"):
        StoreReader(url)
    res = CliRunner().invoke(cli, ["data", "validate", url])
    assert res.exit_code == 1 and "more than once" in res.output


def test_swapped_row_offsets_are_refused_naming_the_sample(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = tmp_path / "s"
    url = _store(store)
    table_path = store / "shards" / SHARD / "samples.parquet"
    t = pq.read_table(table_path)
    offsets = t.column("row_offset").to_pylist()
    offsets[1], offsets[2] = offsets[2], offsets[1]
    t = t.set_column(t.schema.get_field_index("row_offset"), "row_offset", pa.array(offsets, pa.int64()))
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, compression="zstd")
    _rewrite(store, "samples.parquet", sink.getvalue().to_pybytes())
    with pytest.raises(StoreCorruptError, match=r"sample 'sample-00001' \(row 1\) has row_offset 40"):
        StoreReader(url).sample(0)
    assert not validate_store(url).ok


def test_non_finite_values_stop_readers_and_evaluation(tmp_path, monkeypatch):
    import osprey_data.store.writer as writer_mod

    monkeypatch.setattr(writer_mod, "check_record", lambda *a, **k: None)  # let bad data through
    recs = [make_record(i, T=10) for i in range(3)]
    recs[1].hidden_TLD[4, 2, 7] = np.nan
    with StoreWriter(str(tmp_path / "s"), make_header()) as w:
        for r in recs:
            w.add(r)
    r = StoreReader(str(tmp_path / "s"))
    r.sample(0)
    for as_torch in (False, True):
        with pytest.raises(StoreCorruptError, match=r"sample 1 \('sample-00001'\).*hidden has NaN/Inf at token 4"):
            r.sample(1, as_torch=as_torch)
    assert StoreReader(str(tmp_path / "s"), check_values=False).sample(1).hidden_TLD[4, 2, 7] != 0


def test_eval_acceptance_refuses_nan_hidden_states(tmp_path, monkeypatch):
    import torch

    import osprey_data.store.writer as writer_mod
    from osprey_train.drafters.osprey.model import OspreyDrafter
    from osprey_train.models import DrafterConfig, save_drafter

    monkeypatch.setattr(writer_mod, "check_record", lambda *a, **k: None)
    torch.manual_seed(0)
    config = DrafterConfig.from_name("tiny")
    drafter = save_drafter(OspreyDrafter(config), tmp_path / "d")
    header = make_header()
    rec = make_record(0, T=12)
    rec.hidden_TLD[5, 0, 0] = np.inf
    with StoreWriter(str(tmp_path / "s"), header) as w:
        w.add(rec)
    monkeypatch.setattr("osprey_train.evaluation.early_checks.check_compatible", lambda *a, **k: None)
    res = CliRunner().invoke(cli, ["eval", "acceptance", "--drafter", str(drafter), "--store",
                                   str(tmp_path / "s"), "--device", "cpu", "--json"])
    assert res.exit_code == 2 and "hidden has NaN/Inf at token 5" in res.output, res.output


# --- item 13: default validate checks every listed file and the Zarr metadata -------------------

def test_default_validate_reads_every_file_the_commit_lists(tmp_path):
    store = tmp_path / "s"
    url = _store(store)
    path, doc = _commit(store)
    doc["files"]["tokens.zarr/topk_ids/c/7/0"] = {"bytes": 10, "crc32c": 1}  # listed, absent
    path.write_text(json.dumps(doc))
    reseal(store)
    report = validate_store(url)  # values on (the default)
    assert not report.ok
    text = report.format()
    assert "lists tokens.zarr/topk_ids/c/7/0, which is no file of this shard" in text
    assert "tokens.zarr/topk_ids/c/7/0: missing" in text or "c/7/0 is missing" in text


def test_edited_zarr_metadata_with_recomputed_checksum_is_caught(tmp_path):
    store = tmp_path / "s"
    url = _store(store)
    rel = "tokens.zarr/topk_logprobs/zarr.json"
    meta = json.loads((store / "shards" / SHARD / rel).read_text())
    meta["data_type"] = "float16"  # an external Zarr reader would now decode garbage
    _rewrite(store, rel, json.dumps(meta).encode())
    for check_values in (True, False):
        report = validate_store(url, check_values=check_values)
        assert not report.ok and f"{rel} disagrees with the commit record and header in data_type" in report.format()
    import zarr

    assert zarr.open_group(str(store / "shards" / SHARD / "tokens.zarr"), mode="r")["topk_logprobs"].dtype == np.float16


# --- items 3, 14: no store, a file, deep JSON ---------------------------------------------------

def test_validate_and_inspect_agree_on_a_missing_store_or_a_file(tmp_path):
    runner = CliRunner()
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    for cmd in ("validate", "inspect"):
        res = runner.invoke(cli, ["data", cmd, str(tmp_path / "missing")])
        assert res.exit_code == 2 and "missing: does not exist" in res.output, (cmd, res.output)
        res = runner.invoke(cli, ["data", cmd, str(a_file)])
        assert res.exit_code == 2 and "is a file, not a store folder" in res.output, (cmd, res.output)
        assert "Traceback" not in res.output
    with pytest.raises(StoreNotFoundError):
        validate_store(str(tmp_path / "missing"))


def test_deeply_nested_manifest_is_a_clear_error(tmp_path):
    url = _store(tmp_path / "s")
    (tmp_path / "s" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StoreCorruptError, match="manifest is not valid JSON .*nested deeper than 100 levels"):
        StoreReader(url)
    report = validate_store(url)
    assert not report.ok and "nested deeper" in report.format()
    res = CliRunner().invoke(cli, ["data", "inspect", url])
    assert res.exit_code == 2 and "nested deeper" in res.output


# --- item 16: untrusted strings in inspect output ------------------------------------------------

def test_inspect_escapes_domains(tmp_path):
    recs = [make_record(i, T=10, domain="chat\n  problem: forged\x1b[2J") for i in range(2)]
    with StoreWriter(str(tmp_path / "s"), make_header()) as w:
        for r in recs:
            w.add(r)
    res = CliRunner().invoke(cli, ["data", "inspect", str(tmp_path / "s")])
    assert res.exit_code == 0
    assert "\x1b" not in res.output and "\n  problem:" not in res.output
    assert "chat\\n  problem: forged\\x1b[2J: 2 samples" in res.output
    doc = json.loads(CliRunner().invoke(cli, ["data", "inspect", str(tmp_path / "s"), "--json"]).output)
    assert "chat\n  problem: forged\x1b[2J" in doc["domains"]  # JSON keeps the data, escaped by JSON


# --- item 9: one live writer per worker index; commits verify their files ----------------------

def test_second_writer_with_the_same_worker_index_is_refused(tmp_path):
    url = str(tmp_path / "s")
    first = StoreWriter(url, make_header(), shard_max_tokens=40)
    first.add(make_record(0, T=30))
    with pytest.raises(WorkerBusyError, match=rf"worker w000of001 is already writing this store \(pid {os.getpid()}"):
        StoreWriter(url, make_header(), shard_max_tokens=40)
    for i in range(1, 6):
        first.add(make_record(i, T=30))
    first.close()
    second = StoreWriter(url, make_header())  # free again
    assert len(second.done_sample_ids()) == 6
    second.close()
    assert validate_store(url).ok


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    url = str(tmp_path / "s")
    StoreWriter(url, make_header()).close()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "s" / lock_path("w000of001")).write_text(json.dumps({"pid": int(dead.stdout), "host": "h"}))
    w = StoreWriter(url, make_header())
    assert w.worker_lock.taken_over == {"pid": int(dead.stdout), "host": "h"}
    w.close()


def _spawn(url, start, stop, worker=0, num_workers=1, shard_tokens=60):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.data.store._writer_proc", str(url), str(start), str(stop),
         str(worker), str(num_workers), str(shard_tokens), "-1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_writers_started_together_as_one_worker_lose_nothing(tmp_path):
    url = tmp_path / "s"
    procs = [_spawn(url, 0, 40), _spawn(url, 0, 40)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    refused = [err for code, err in results if code != 0]
    assert all("is already writing this store" in err for err in refused), refused
    assert len(refused) <= 1  # one may have finished before the other started
    report = validate_store(str(url))
    assert report.ok, report.format()
    r = StoreReader(str(url))
    ids = sorted(s.sample_id for s in r.iter_samples())
    assert ids == sorted(make_record(i).sample_id for i in range(40))
    for s in r.iter_samples():  # every committed shard is whole: the data is the data written
        np.testing.assert_array_equal(s.hidden_TLD, bf16_round(make_record(int(s.sample_id.split("-")[1])).hidden_TLD))


def test_commit_with_a_file_gone_is_not_published_and_is_redone(tmp_path, monkeypatch):
    from osprey_data.store import shard as shard_mod

    url = str(tmp_path / "s")
    real_finish = shard_mod.ShardBuilder.finish

    def finish_then_lose_a_chunk(self):
        out = real_finish(self)
        os.unlink(os.path.join(self.fs.path(self.rel_dir), "tokens.zarr", "topk_ids", "c", "0", "0"))
        return out

    monkeypatch.setattr(shard_mod.ShardBuilder, "finish", finish_then_lose_a_chunk)
    w = StoreWriter(url, make_header())
    for i in range(3):
        w.add(make_record(i, T=10))
    with pytest.raises(StoreError, match="shard not committed, its files changed under the writer.*c/0/0 is missing"):
        w.close()
    monkeypatch.undo()
    assert len(StoreReader(url)) == 0 and validate_store(url).ok  # nothing half-published
    w = StoreWriter(url, make_header())  # the broken shard is not adopted: its samples are redone
    assert w.done_sample_ids() == set() and not (tmp_path / "s" / "shards" / SHARD).exists()
    for i in range(3):
        w.add(make_record(i, T=10))
    w.close()
    assert len(StoreReader(url)) == 3 and validate_store(url).ok


# --- item 15: pyarrow's abort at exit --------------------------------------------------------------

def test_store_reads_tables_without_python_files_or_threads(tmp_path, monkeypatch):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    url = _store(tmp_path / "s", n=8, shard_max_tokens=50)
    real_init, real_read = pq.ParquetFile.__init__, pq.ParquetFile.read
    seen = []

    def no_dataset_reader(*args, **kwargs):  # its scanner starts an Arrow pool thread (issue #25 item 15)
        raise AssertionError("pq.read_table starts an Arrow thread: pyarrow may abort the interpreter at exit")

    def guarded_init(self, source, *args, **kwargs):
        seen.append(type(source).__name__)
        python_file = isinstance(source, io.IOBase) and not isinstance(source, pa.NativeFile)
        assert not python_file, "a Python file object: pyarrow may abort the interpreter at exit"
        return real_init(self, source, *args, **kwargs)

    def guarded_read(self, *args, **kwargs):
        assert kwargs.get("use_threads") is False, "pyarrow's threaded reader may abort the interpreter at exit"
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", no_dataset_reader)
    monkeypatch.setattr(pq.ParquetFile, "__init__", guarded_init)
    monkeypatch.setattr(pq.ParquetFile, "read", guarded_read)
    inspect_store(url)
    validate_store(url)
    StoreReader(url).sample(5)
    StoreWriter(url, make_header(), shard_max_tokens=50).close()  # recovery reads sample ids
    merge_store(url)
    assert len(seen) >= 3


_INSPECT = "import sys; from osprey_data.store import inspect_store; inspect_store(sys.argv[1])"


@pytest.mark.slow
def test_inspect_in_many_fresh_processes_never_aborts(tmp_path):
    url = _store(tmp_path / "s", n=30, shard_max_tokens=100)
    codes = []
    for _ in range(60):  # threaded reads aborted 2-12 runs in 60 (pyarrow 26); none since
        codes.append(subprocess.run([sys.executable, "-c", _INSPECT, url], cwd=ROOT, capture_output=True).returncode)
    assert codes == [0] * len(codes)


def test_full_disk_while_writing_a_shard_names_the_file_and_leaves_no_temp_dir(tmp_path, monkeypatch):
    import errno

    from osprey_data.store import fs as fs_mod

    url = str(tmp_path / "s")
    with StoreWriter(url, make_header(), shard_max_tokens=40) as w:  # one committed shard first
        for i in range(3):
            w.add(make_record(i, T=20))

    import builtins

    class FullDisk:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_disk_open(file, mode="r", *args, **kwargs):
        return FullDisk() if "w" in mode else builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(fs_mod, "open", full_disk_open, raising=False)
    w = StoreWriter(url, make_header(), shard_max_tokens=40)
    w.add(make_record(3, T=20))
    with pytest.raises(StoreError, match=r"No space left on device: '.*/shards/\.tmp-w000of001-\d+-\w+/"):
        w.close()
    monkeypatch.undo()
    assert not [p for p in (tmp_path / "s" / "shards").iterdir() if p.name.startswith(".tmp-")]
    assert validate_store(url).ok and len(StoreReader(url)) == 3

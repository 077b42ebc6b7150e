"""Issue #45 item 12 (C05, S11c): a full cache disk is read uncached (not "cache size limit must be
positive, got 0 bytes", a limit nobody set); a damaged object-store worker lock says so and how to
clear it, instead of naming "another process"."""

from __future__ import annotations

import logging
import shutil
from collections import namedtuple

import pytest

from osprey_data.errors import ConfigError
from osprey_data.store import StoreReader
from osprey_data.store import cache as cache_mod
from osprey_data.store.cache import ShardFileCache
from osprey_data.store.fs import StoreFS
from osprey_data.store.worker_lock import WorkerBusyError, WorkerLock, lock_path
from tests.data.store.helpers import check_content, ids, write_records

_Usage = namedtuple("_Usage", "total used free")


def test_a_full_cache_disk_reads_uncached_with_one_warning(tmp_path, monkeypatch, caplog):
    url = str(tmp_path / "s")
    write_records(url, range(4), shard_tokens=40)
    monkeypatch.setattr(cache_mod.shutil, "disk_usage", lambda path: _Usage(100, 100, 0))
    with caplog.at_level(logging.WARNING, logger="osprey_data.store.cache"):
        reader = StoreReader(url, cache=tmp_path / "cache", prefetch=False)
        check_content(reader, ids(range(4)))
    assert reader.cache is None
    warned = [rec.getMessage() for rec in caplog.records if "uncached" in rec.getMessage()]
    assert len(warned) == 1 and "no free space for a store cache" in warned[0]
    assert "must be positive" not in caplog.text
    # a limit the user set to nothing is still their error
    with pytest.raises(ConfigError, match="must be positive, got 0 bytes"):
        ShardFileCache(tmp_path / "c2", url, max_bytes=0)
    monkeypatch.setattr(cache_mod.shutil, "disk_usage", shutil.disk_usage)


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"since": "x"}', b"\xff\xfe"])
def test_a_damaged_object_store_worker_lock_says_so_and_how_to_clear_it(content):
    url = f"memory://osprey-45-lock-{abs(hash(content))}"
    fs = StoreFS(url, read_only=False)
    assert not fs.is_local
    fs.write_atomic(lock_path("w0"), content)
    with pytest.raises(WorkerBusyError, match=r"the lock object of worker w0 is damaged .*owner is unknown. If no "
                                              r"writer of worker w0 is running, delete that object and run again"):
        WorkerLock(fs, "w0").acquire()


def test_a_live_object_store_lock_still_names_its_owner():
    url = "memory://osprey-45-lock-live"
    fs = StoreFS(url, read_only=False)
    first = WorkerLock(fs, "w0")
    first.acquire()
    try:
        with pytest.raises(WorkerBusyError, match=r"already writing this store \(pid \d+ on host"):
            WorkerLock(fs, "w0").acquire()
    finally:
        first.release()

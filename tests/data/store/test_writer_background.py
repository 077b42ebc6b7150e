"""The writer overlaps the caller: add() returns before encoding, and memory stays bounded."""

from __future__ import annotations

import threading
import time

import pytest

from osprey_data.errors import StoreError
from osprey_data.store import StoreReader, StoreWriter
from osprey_data.store import writer as writer_mod
from osprey_data.store.shard import ShardBuilder
from tests.data.store.helpers import make_header, make_record


def test_add_is_asynchronous_and_queue_is_bounded(tmp_path, monkeypatch):
    gate = threading.Event()
    real_add = ShardBuilder.add

    def slow_add(self, rec):
        gate.wait(timeout=30)
        real_add(self, rec)

    monkeypatch.setattr(ShardBuilder, "add", slow_add)
    w = StoreWriter(str(tmp_path / "s"), make_header())
    n_added = 0

    def producer():
        nonlocal n_added
        for i in range(writer_mod.QUEUE_RECORDS + 5):
            w.add(make_record(i))
            n_added += 1

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    time.sleep(0.5)
    # one record is held by the blocked background thread, QUEUE_RECORDS wait in the queue
    assert n_added == writer_mod.QUEUE_RECORDS + 1
    assert t.is_alive()
    gate.set()
    t.join(timeout=30)
    w.close()
    assert len(StoreReader(str(tmp_path / "s"))) == writer_mod.QUEUE_RECORDS + 5


def test_background_failure_surfaces_in_caller(tmp_path, monkeypatch):
    def boom(self, rec):
        raise OSError("disk full")

    monkeypatch.setattr(ShardBuilder, "add", boom)
    w = StoreWriter(str(tmp_path / "s"), make_header())
    w.add(make_record(0))
    with pytest.raises(StoreError, match="disk full"):
        for i in range(1, 50):
            w.add(make_record(i))
            time.sleep(0.01)
    with pytest.raises(StoreError):
        w.close()
    assert len(StoreReader(str(tmp_path / "s"))) == 0

"""BatchPrefetcher: prefetched batches equal direct ones (order, content, jumps, errors)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_data.store import StoreReader
from osprey_train.distill_data.packing import StorePacker
from osprey_train.distill_data.prefetch import BatchPrefetcher
from tests.train.evaluation.store_util import make_store


class Recorder:
    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple[int, str]] = []
        self.fail_at = fail_at

    def __call__(self, i: int) -> int:
        self.calls.append((i, threading.current_thread().name))
        if i == self.fail_at:
            raise ValueError(f"bad batch {i}")
        return i * i


def test_prefetcher_builds_ahead_on_its_thread_and_follows_jumps():
    make = Recorder()
    p = BatchPrefetcher(make, depth=2, stride=3, stop=30)
    assert [p.get(i) for i in (1, 4, 7)] == [1, 16, 49]
    time.sleep(0.2)  # let the worker finish what is queued
    built = [i for i, _ in make.calls]
    assert built[:3] == [1, 4, 7] and {10, 13} <= set(built)  # depth 2 ahead of 7, stride 3
    assert all(name.startswith("osprey-prefetch") for _, name in make.calls)
    # a jump (resume, skipped steps): built on demand, and prefetching continues from there
    assert p.get(25) == 625 and p.get(28) == 784
    time.sleep(0.2)
    assert max(i for i, _ in make.calls) == 28  # nothing at or beyond stop=30
    p.close()


def test_prefetcher_raises_for_the_failing_batch_only():
    p = BatchPrefetcher(Recorder(fail_at=2), depth=3)
    assert p.get(0) == 0 and p.get(1) == 1  # index 2 already failed in the background
    with pytest.raises(ValueError, match="bad batch 2"):
        p.get(2)
    assert p.get(3) == 9
    p.close()
    with pytest.raises(ConfigError, match="depth"):
        BatchPrefetcher(Recorder(), depth=0)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_llama_dir):
    return make_store(tmp_path_factory.mktemp("prefetch") / "store", tiny_llama_dir, num_samples=8,
                      max_new_tokens=8)


def _same(a, b) -> bool:
    return all((x is None and y is None) or torch.equal(x, y)
               for x, y in ((getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)))


def test_prefetched_store_batches_equal_direct_ones(store):
    """Two ranks' worth of indices (stride 2), across an epoch boundary, with a jump back."""
    direct = StorePacker(StoreReader(str(store)), 48, seed=3)
    ahead = BatchPrefetcher(StorePacker(StoreReader(str(store)), 48, seed=3).batch, depth=2, stride=2)
    epoch_rows = len(direct.plan(0).rows)
    order = [1, 3, 5, 7, 9, 11, 2 * epoch_rows + 1, 2 * epoch_rows + 3, 3]
    for i in order:
        assert _same(ahead.get(i), direct.batch(i)), i
    ahead.close()

"""Subprocess entry for crash and concurrency tests: write records [start, stop) into a store.

Usage: python -m tests.data.store._writer_proc URL START STOP WORKER NUM_WORKERS SHARD_TOKENS KILL_AT
KILL_AT >= 0: after adding record KILL_AT, wait until at least one shard is committed and an
unfinished shard folder exists, then SIGKILL ourselves (a crash mid-shard).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from osprey_data.store import StoreWriter
from tests.data.store.helpers import make_header, make_record


def main(argv: list[str]) -> None:
    url, start, stop, worker, num_workers, shard_tokens, kill_at = argv
    start, stop, worker, num_workers = int(start), int(stop), int(worker), int(num_workers)
    shard_tokens, kill_at = int(shard_tokens), int(kill_at)
    w = StoreWriter(url, make_header("bf16"), worker_index=worker, num_workers=num_workers,
                    shard_max_tokens=shard_tokens)
    done = w.done_sample_ids()
    for i in range(start, stop):
        rec = make_record(i)
        if rec.sample_id in done:
            continue
        w.add(rec)
        if i == kill_at:
            shards = os.path.join(url, "shards")
            deadline = time.time() + 30
            while time.time() < deadline:
                names = os.listdir(shards)
                if any(n.startswith(".tmp-") for n in names) and any(not n.startswith(".") for n in names) \
                        and w._queue.empty():
                    break
                time.sleep(0.01)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
    w.close()


if __name__ == "__main__":
    main(sys.argv[1:])

"""Run a module as ``__main__`` and SIGKILL the process at the worst moment of a shard commit.

``OSPREY_TEST_KILL_BEFORE_COMMIT=N python -m tests.helpers.killable MODULE ARGS...`` runs
``MODULE`` (e.g. ``cli.main`` or a test writer) and kills the process with SIGKILL right before
it writes its N-th shard commit record (``_COMMIT.json``): every data file of that shard is
already written — on object storage, in place under its final prefix — and nothing marks it
complete. A real crash (no cleanup, no ``finally``), at a deterministic point.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from osprey_data.store import fs as store_fs

_original = store_fs.StoreFS.write_atomic
_seen = 0


def _write_atomic(self, rel, data, **kw):
    global _seen
    if rel.endswith("/_COMMIT.json"):
        _seen += 1
        if _seen == int(os.environ["OSPREY_TEST_KILL_BEFORE_COMMIT"]):
            os.kill(os.getpid(), signal.SIGKILL)
    return _original(self, rel, data, **kw)


if __name__ == "__main__":
    store_fs.StoreFS.write_atomic = _write_atomic
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)

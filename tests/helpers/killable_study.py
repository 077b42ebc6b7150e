"""Run a module as ``__main__`` and SIGKILL the process inside a training stage of a study.

``OSPREY_TEST_KILL_IN=distill:N python -m tests.helpers.killable_study osprey_cli.main study run ...``
kills the process (SIGKILL: no cleanup, no ``finally``) right after the N-th trainer checkpoint
written inside a ``distill`` stage's work folder: a real crash, at a deterministic point.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from osprey_train.trainer import loop

_original = loop.save_checkpoint
_seen = 0


def _save_checkpoint(ckpt_root, *args, **kwargs):
    global _seen
    path = _original(ckpt_root, *args, **kwargs)
    kind, count = os.environ["OSPREY_TEST_KILL_IN"].split(":")
    if f"/{kind}-" in str(ckpt_root):
        _seen += 1
        if _seen == int(count):
            os.kill(os.getpid(), signal.SIGKILL)
    return path


if __name__ == "__main__":
    loop.save_checkpoint = _save_checkpoint
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)

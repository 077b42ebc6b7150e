"""Run a module as ``__main__`` with every unit of long work slowed down and logged, so that a
test can send SIGINT/SIGTERM while it runs, at a point it chooses at random.

``OSPREY_TEST_UNIT_LOG=FILE OSPREY_TEST_UNIT_SLEEP=S python -m tests.helpers.slow_steps MODULE ARGS...``
runs ``MODULE`` (e.g. ``osprey_cli.main``); each trainer step, drafter x store cell of a matrix
and tree shape of a sweep appends one line to ``FILE`` when it starts, then sleeps ``S`` seconds.
The work itself is unchanged (the sleep happens before it), so results stay bit-identical to an
unslowed run.
"""

from __future__ import annotations

import os
import runpy
import sys
import time

from osprey_train.evaluation import matrix, sweep
from osprey_train.trainer import loop


def _slowed(fn, what: str):
    def wrapper(*args, **kwargs):
        with open(os.environ["OSPREY_TEST_UNIT_LOG"], "a") as f:
            f.write(f"{what}\n")
        time.sleep(float(os.environ.get("OSPREY_TEST_UNIT_SLEEP", "0.2")))
        return fn(*args, **kwargs)
    return wrapper


if __name__ == "__main__":
    loop.lr_at = _slowed(loop.lr_at, "step")   # called once at the start of every step
    for module, name in ((matrix, "evaluate_acceptance"), (sweep, "evaluate_tree_acceptance")):
        if hasattr(module, name):
            setattr(module, name, _slowed(getattr(module, name), name))
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)

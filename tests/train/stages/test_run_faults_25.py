"""Fault-round item 12 of issue #25: one run per ``--out`` (run lock) and resumes that would continue
a foreign checkpoint (another ``--store``, ``--ttt-steps``, ``--target-dist``) are refused, naming the
option and both values; operational options may change; a checkpoint beyond ``--steps`` is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from osprey_data.errors import CheckpointError
from osprey_train.stages.distill import run
from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.loop import train
from osprey_train.trainer.run_lock import LOCK_NAME, RunBusyError, run_lock
from tests.train.evaluation.store_util import make_drafter_dir, make_store
from tests.train.stages.test_distill import _cfg
from tests.train.trainer.toy import ToyTask


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_llama_dir):
    root = tmp_path_factory.mktemp("run_faults")
    store = make_store(root / "store", tiny_llama_dir, num_samples=4, max_new_tokens=8, final_hidden=True)
    return store, make_drafter_dir(root / "drafter", store=store)


def _hold_lock_in_child(folder):
    """A live process holding ``folder``'s run lock; returns it once the lock is held."""
    code = textwrap.dedent(f"""
        import sys, time
        from osprey_train.trainer.run_lock import run_lock
        with run_lock({str(folder)!r}):
            print("held", flush=True)
            time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=os.getcwd(), env={**os.environ, "RANK": "0"})
    assert child.stdout.readline().strip() == "held"
    return child


def _toy_loop(out, **kw):
    return LoopConfig(out_dir=out, max_steps=2, progress=False, device="cpu", plot=False, **kw)


def test_a_second_run_on_one_folder_is_refused_naming_the_holder(tmp_path):
    child = _hold_lock_in_child(tmp_path / "run")
    try:
        with pytest.raises(RunBusyError, match=rf"another training run .*pid {child.pid} on host"):
            train(ToyTask(), _toy_loop(tmp_path / "run"), OptimConfig())
        assert not (tmp_path / "run" / "metrics.jsonl").exists()   # nothing of the run was written
    finally:
        child.kill()
        child.wait()
    # the holder died (SIGKILL): its lock is stale and taken over
    res = train(ToyTask(), _toy_loop(tmp_path / "run"), OptimConfig())
    assert res.step == 2
    assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_stale_lock_file_of_a_dead_pid_is_taken_over(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).write_text(json.dumps({"pid": 2**22 + 7, "host": "elsewhere"}))
    assert train(ToyTask(), _toy_loop(tmp_path / "run"), OptimConfig()).step == 2


def test_the_lock_is_reentrant_in_one_process_and_released_after(tmp_path):
    with run_lock(tmp_path), run_lock(tmp_path):
        pass
    with run_lock(tmp_path):   # released: a new hold works
        pass


def test_cli_distill_on_a_busy_folder_exits_2_with_one_line(tmp_path, setup):
    from click.testing import CliRunner

    from osprey_cli.main import cli

    store, drafter = setup
    child = _hold_lock_in_child(tmp_path / "run")
    try:
        res = CliRunner().invoke(cli, ["train", "distill", "--drafter", str(drafter), "--store", str(store),
                                       "--out", str(tmp_path / "run"), "--steps", "1", "--device", "cpu"])
    finally:
        child.kill()
        child.wait()
    assert res.exit_code == 2, res.output
    assert f"pid {child.pid}" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(("change", "pattern"), [
    ({"store": "OTHER"}, r"--store: checkpoint '.*store', now '.*other-store'"),
    ({"ttt_steps": 2}, r"--ttt-steps: checkpoint 3, now 2"),
    ({"target_dist": "renorm"}, r"--target-dist: checkpoint 'tail', now 'renorm'"),
    ({"freeze_embeddings": False}, r"--train-embeddings: checkpoint False, now True"),
])
def test_resume_with_foreign_options_is_refused(tmp_path, setup, change, pattern):
    store, drafter = setup
    run(_cfg(tmp_path, drafter, store, max_steps=2, save_every=1))
    if change.get("store") == "OTHER":
        change = {"store": str(shutil.copytree(store, tmp_path / "other-store"))}
    args = {"store": store, **change}
    with pytest.raises(CheckpointError, match=pattern):
        run(_cfg(tmp_path, drafter, args.pop("store"), max_steps=2, save_every=1, resume=True, **args))


def test_operational_options_may_change_on_resume(tmp_path, setup):
    store, drafter = setup
    run(_cfg(tmp_path, drafter, store, max_steps=2, save_every=1))
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-2")
    res = run(_cfg(tmp_path, drafter, store, max_steps=2, save_every=2, prefetch=0, log_every=2,
                   keep_checkpoints=5, resume=True))
    assert res.resumed_from.name == "step-1" and res.step == 2


def test_a_memory_knob_may_change_on_resume(tmp_path, setup):
    # issue 45: --loss-chunk (rows of logits held at once) blocked --resume of train distill
    from osprey_train.trainer.resume_check import RESUME_FREE

    assert set(RESUME_FREE) == {"loss_chunk"}
    store, drafter = setup
    run(_cfg(tmp_path, drafter, store, max_steps=2, save_every=1))
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-2")
    res = run(_cfg(tmp_path, drafter, store, max_steps=2, save_every=1, loss_chunk=7, resume=True))
    assert res.resumed_from.name == "step-1" and res.step == 2


def test_a_checkpoint_beyond_steps_is_refused(tmp_path, setup):
    store, drafter = setup
    run(_cfg(tmp_path, drafter, store, max_steps=2, save_every=1))
    with pytest.raises(CheckpointError, match=r"step-2: the checkpoint is at step 2, beyond --steps 1"):
        run(_cfg(tmp_path, drafter, store, max_steps=1, resume=True))

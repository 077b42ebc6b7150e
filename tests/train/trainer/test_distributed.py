"""Two CPU processes under torchrun (gloo) train what one process with accumulation trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.checkpoint import read_trainer_state
from osprey_train.trainer.loop import train
from osprey_train.trainer.metrics import read_metrics
from tests.train.trainer.toy import ToyTask

ROOT = Path(__file__).resolve().parents[3]


def torchrun(*args: str, nproc: int = 2) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "tests.train.trainer.ddp_worker", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


# The default suite covers 2-rank DDP through the pretrain stage (tests/train/stages); these
# toy-task runs (DDP, FSDP + FSDP resume) cost ~30 s of process start-up and run with -m slow.
@pytest.mark.slow
def test_ddp_two_ranks_matches_single_process(tmp_path):
    torchrun(str(tmp_path / "ddp"), "ddp", "4")
    single = train(ToyTask(dropout=0.0),
                   LoopConfig(out_dir=tmp_path / "one", max_steps=4, grad_accum=2, log_every=1, progress=False,
                              device="cpu", distributed="none", plot=False),
                   OptimConfig(lr=3e-3, warmup_ratio=0.2))
    ddp_w = load_file(str(tmp_path / "ddp" / "final" / "model.safetensors"))
    one_w = load_file(str(single.final_dir / "model.safetensors"))
    for name in one_w:
        torch.testing.assert_close(ddp_w[name], one_w[name], rtol=1e-5, atol=1e-6, msg=name)
    ddp_loss = [r["loss"] for r in read_metrics(tmp_path / "ddp" / "metrics.jsonl") if r["kind"] == "train"]
    one_loss = [r["loss"] for r in read_metrics(tmp_path / "one" / "metrics.jsonl") if r["kind"] == "train"]
    assert ddp_loss == pytest.approx(one_loss, rel=1e-5)
    state = read_trainer_state(tmp_path / "ddp" / "checkpoints" / "step-4")
    assert state["world_size"] == 2 and state["distributed"] == "ddp"
    assert state["tokens_seen"] == single.tokens_seen == 4 * 2 * 4 * 8
    assert sorted(p.name for p in (tmp_path / "ddp" / "checkpoints" / "step-4" / "rng").iterdir()) == \
        ["rank-0.json", "rank-1.json"]


@pytest.mark.slow
def test_fsdp_two_ranks_matches_single_process_and_resumes(tmp_path):
    out = tmp_path / "fsdp"
    torchrun(str(out), "fsdp", "4")
    single = train(ToyTask(dropout=0.0),
                   LoopConfig(out_dir=tmp_path / "one", max_steps=4, grad_accum=2, log_every=1, progress=False,
                              device="cpu", distributed="none", plot=False),
                   OptimConfig(lr=3e-3, warmup_ratio=0.2))
    fsdp_w = load_file(str(out / "final" / "model.safetensors"))
    one_w = load_file(str(single.final_dir / "model.safetensors"))
    for name in one_w:
        torch.testing.assert_close(fsdp_w[name], one_w[name], rtol=1e-5, atol=1e-6, msg=name)
    # Resume from the step-2 checkpoint (sharded optimizer state gathered/scattered by name).
    import shutil

    shutil.rmtree(out / "checkpoints" / "step-4")
    shutil.rmtree(out / "final")
    torchrun(str(out), "fsdp", "4", "resume")
    again = load_file(str(out / "final" / "model.safetensors"))
    for name in fsdp_w:
        torch.testing.assert_close(again[name], fsdp_w[name], rtol=0, atol=0, msg=name)

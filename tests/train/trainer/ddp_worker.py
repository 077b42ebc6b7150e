"""Entry point run under torchrun by test_distributed.py: trains the toy task in one rank."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.loop import train
from tests.train.trainer.toy import ToyTask

if __name__ == "__main__":
    out, mode, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    resume = len(sys.argv) > 4 and sys.argv[4] == "resume"
    torch.set_num_threads(1)
    loop = LoopConfig(out_dir=out, max_steps=steps, save_every=2, eval_every=2, log_every=1, progress=False,
                      device="cpu", distributed=mode, plot=False, resume=resume)
    train(ToyTask(dropout=0.0), loop, OptimConfig(lr=3e-3, warmup_ratio=0.2))

"""A tiny, fast TrainTask for trainer tests: a 1-block MLP language model with dropout.

Batches follow a learnable rule (next = (3 * prev + 1) mod V, with noise) so the loss falls;
dropout makes the RNG matter, so exact-resume tests also check RNG restoration. The global
micro-batch of a step is split by ``slot = micro * world_size + rank`` so that a run with N
ranks and accumulation A sees the same global batch as one rank with accumulation N * A.
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

__all__ = ["ToyLM", "ToyTask", "Crash"]


class Crash(RuntimeError):
    """Raised by ToyTask.batch to simulate a job killed mid-run."""


class ToyLM(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(),
                                                   nn.Linear(2 * dim, dim))])
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids_BT: torch.Tensor) -> torch.Tensor:
        h_BTD = self.embed(ids_BT)
        for block in self.blocks:
            h_BTD = h_BTD + self.drop(block(h_BTD))
        return self.head(self.norm(h_BTD))


class ToyTask:
    def __init__(self, *, vocab: int = 32, dim: int = 16, batch_size: int = 4, seq_len: int = 8,
                 dropout: float = 0.1, crash_at_step: int | None = None, nan_at_step: int | None = None,
                 signal_at_step: int | None = None, signum: int = signal.SIGINT, signal_in_eval: bool = False) -> None:
        self.vocab, self.dim, self.batch_size, self.seq_len = vocab, dim, batch_size, seq_len
        self.dropout = dropout
        self.crash_at_step = crash_at_step
        self.nan_at_step = nan_at_step
        self.signal_at_step, self.signum, self.signal_in_eval = signal_at_step, signum, signal_in_eval
        self.batches_seen: list[tuple[int, int, int]] = []
        self.perplexity_of = "loss"   # a plain next-token cross-entropy

    def build_model(self) -> nn.Module:
        return ToyLM(self.vocab, self.dim, self.dropout)

    def _sequences(self, seed: int, n: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        ids = torch.empty(n, self.seq_len + 1, dtype=torch.long)
        ids[:, 0] = torch.randint(0, self.vocab, (n,), generator=g)
        for t in range(1, self.seq_len + 1):
            ids[:, t] = (3 * ids[:, t - 1] + 1) % self.vocab
        noise = torch.rand(n, self.seq_len + 1, generator=g) < 0.1
        ids[noise] = torch.randint(0, self.vocab, (int(noise.sum()),), generator=g)
        return ids

    def batch(self, step: int, micro: int, rank: int, world_size: int) -> dict:
        if self.crash_at_step is not None and step == self.crash_at_step:
            raise Crash(f"simulated crash at step {step}")
        if self.signal_at_step is not None and step == self.signal_at_step and micro == 0:
            os.kill(os.getpid(), self.signum)   # a real signal in the middle of the step
        slot = micro * world_size + rank
        self.batches_seen.append((step, micro, rank))
        return {"ids": self._sequences(100_003 * step + slot, self.batch_size), "step": step}

    def loss(self, model: nn.Module, batch: dict):
        ids = batch["ids"]
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), ids[:, 1:].reshape(-1))
        if self.nan_at_step is not None and batch["step"] == self.nan_at_step:
            loss = loss * float("nan")
        return loss, {"tokens": float(ids[:, 1:].numel())}

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        if self.signal_in_eval:
            os.kill(os.getpid(), signal.SIGINT)
        ids = self._sequences(7, 16).to(next(model.parameters()).device)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), ids[:, 1:].reshape(-1)).item()
        return {"eval_loss": loss, "eval_ppl": math.exp(loss)}

    def save_model(self, model: nn.Module, out_dir: Path) -> None:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(Path(out_dir) / "model.safetensors"))
        (Path(out_dir) / "config.json").write_text(json.dumps({"vocab": self.vocab, "dim": self.dim}))

"""Trainer overhead: tokens/s of ``osprey_train.trainer.train`` vs a bare training loop.

Both run the SAME model (a random Llama, or ``--model DIR``), the SAME batch and AdamW
settings, in the same process, alternating ``--repeats`` times (median reported) so machine
noise hits both alike. The bare loop is forward + backward + optimizer step + zero_grad and
nothing else; the trainer adds what a real run needs (schedule, grad clipping, accumulation
bookkeeping, metrics, progress bar). Both are timed from the start of step 1 to the start of
the last step (first step = lazy optimizer allocation; after the last one the trainer writes
its final checkpoint, which is not a per-step cost). Wall-clock and process CPU time are both
reported; on a shared CPU box the CPU-time ratio is the reliable one. Goal: overhead <= 10 %.

Usage: python benchmarks/pretrain_bench.py [--steps 30 --batch-size 4 --seq-len 256 --threads 1] [--quick]
(``--quick``: < 60 s, 12 steps x 2 repeats at sequence length 128.)
Ends with one line ``RESULT trainer_tok_s=... bare_tok_s=... overhead_pct=... ...``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.loop import train


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if args.model:
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                      num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=4096)
    return LlamaForCausalLM(cfg)


def lm_loss(model: torch.nn.Module, ids_BT: torch.Tensor) -> torch.Tensor:
    logits_BTV = model(input_ids=ids_BT[:, :-1]).logits
    return F.cross_entropy(logits_BTV.float().reshape(-1, logits_BTV.shape[-1]), ids_BT[:, 1:].reshape(-1))


def _stamp() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _rates(stamps: list[tuple[float, float]], tokens_per_step: int) -> tuple[float, float]:
    """(wall, cpu) tokens/s between the start of step 1 and the start of the last step.

    Step 0 (lazy optimizer-state allocation) and the last step (followed by the trainer's
    final checkpoint) are excluded for both loops alike. CPU time of this process is reported
    too: with one thread it is what the step costs, regardless of other jobs on a shared box.
    """
    (w0, c0), (w1, c1) = stamps[1], stamps[-1]
    n = len(stamps) - 2
    return n * tokens_per_step / (w1 - w0), n * tokens_per_step / max(c1 - c0, 1e-9)


class BenchTask:
    """TrainTask that replays one fixed batch (as the bare loop does) and stamps step starts."""

    def __init__(self, model: torch.nn.Module, ids_BT: torch.Tensor) -> None:
        self.model, self.ids_BT = model, ids_BT
        self.stamps: list[tuple[float, float]] = []

    def build_model(self) -> torch.nn.Module:
        return self.model

    def batch(self, step: int, micro: int, rank: int, world_size: int) -> torch.Tensor:
        if micro == 0:
            self.stamps.append(_stamp())
        return self.ids_BT

    def loss(self, model: torch.nn.Module, batch: torch.Tensor):
        return lm_loss(model, batch), {"tokens": float(batch.shape[0] * (batch.shape[1] - 1))}

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        return {}

    def save_model(self, model: torch.nn.Module, out_dir: Path) -> None:
        (Path(out_dir) / "skipped").write_text("benchmark: final model not saved")


def bare_loop(model: torch.nn.Module, ids_BT: torch.Tensor, steps: int, device: torch.device) -> tuple[float, float]:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ids = ids_BT.to(device)
    stamps = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        stamps.append(_stamp())
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.enable_grad()
        with ctx:
            loss = lm_loss(model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return _rates(stamps, ids.shape[0] * (ids.shape[1] - 1))


def trainer_run(model: torch.nn.Module, ids_BT: torch.Tensor, steps: int, device: str, out: Path) -> tuple[float, float]:
    loop = LoopConfig(out_dir=out, max_steps=steps, log_every=10, device=device, distributed="none",
                      progress=True, plot=False, keep_checkpoints=1)
    task = BenchTask(model, ids_BT)
    train(task, loop, OptimConfig(lr=1e-4))
    return _rates(task.stamps, ids_BT.shape[0] * (ids_BT.shape[1] - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF causal-LM folder (default: random Llama)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (shared machines: 1)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="< 60 s: 12 steps, 2 repeats, seq-len 128")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.seq_len = min(args.steps, 12), min(args.repeats, 2), min(args.seq_len, 128)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))

    model = make_model(args).to(device)
    vocab = model.get_input_embeddings().num_embeddings
    ids_BT = torch.randint(0, vocab, (args.batch_size, args.seq_len + 1), generator=torch.Generator().manual_seed(0))
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}

    bare_loop(model, ids_BT, 3, device)            # warm-up (allocator, kernels, threads)
    bare, trained = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            model.load_state_dict(init)
            bare.append(bare_loop(model, ids_BT, args.steps, device))
            model.load_state_dict(init)
            trained.append(trainer_run(model, ids_BT, args.steps, str(device), Path(tmp) / f"run{r}"))
    bw, bc = (statistics.median(x[i] for x in bare) for i in (0, 1))
    tw, tc = (statistics.median(x[i] for x in trained) for i in (0, 1))
    over_wall, over_cpu = 100.0 * (bw / tw - 1.0), 100.0 * (bc / tc - 1.0)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M params, batch {args.batch_size}x{args.seq_len}, {args.steps} steps, "
          f"{args.repeats} repeats, device {device}, threads {args.threads}")
    print(f"{'loop':<10}{'wall tok/s':>12}{'cpu tok/s':>12}   runs (wall)")
    print(f"{'bare':<10}{bw:>12.0f}{bc:>12.0f}   {[round(x[0]) for x in bare]}")
    print(f"{'trainer':<10}{tw:>12.0f}{tc:>12.0f}   {[round(x[0]) for x in trained]}")
    print(f"trainer / bare: wall {tw / bw:.3f} (overhead {over_wall:+.1f} %), cpu {tc / bc:.3f} "
          f"(overhead {over_cpu:+.1f} %); goal <= 10 %")
    # CPU time is the primary figure on CPU (robust to other jobs); wall on CUDA.
    primary = over_cpu if device.type == "cpu" else over_wall
    print(f"RESULT trainer_tok_s={tw:.0f} bare_tok_s={bw:.0f} ratio={tw / bw:.3f} overhead_pct={over_wall:.1f} "
          f"cpu_overhead_pct={over_cpu:.1f} goal_pct=10 pass={'yes' if primary <= 10.0 else 'no'} "
          f"load_avg={os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()

"""The generic training loop shared by Stage 2 (pretrain) and Stage 4 (distill).

A stage describes WHAT to train through a :class:`TrainTask` (model, deterministic batches,
loss, evaluation, saving); :func:`train` does the rest: seeding, device and DDP/FSDP setup,
AdamW + schedule, gradient accumulation and clipping, bf16 autocast (``LoopConfig.precision``:
by default on CUDA and on CPUs with bf16 matrix units, float32 elsewhere),
periodic evaluation, atomic checkpoints and exact resume, metrics.jsonl + metrics.png, and a
tqdm bar with tokens/s.

Determinism contract (what makes "10 steps == 5 + resume + 5" hold bit for bit on CPU): the
task's ``batch(step, micro, rank, world_size)`` is a pure function of its arguments, the
learning rate is a pure function of the step, and weights, optimizer state and every RNG are
restored from the checkpoint.

Batches are moved to the training device here (tensors inside dicts/lists/tuples), so tasks
can build them on CPU. ``loss`` must return the MEAN loss of its micro-batch; the trainer
divides by ``grad_accum`` and DDP averages over ranks, so one step optimises the mean over the
global batch.

Interruption (SIGINT / Ctrl-C, SIGTERM): the step in progress is finished (an evaluation in
progress is dropped), a checkpoint of it is written even with ``save_every=0``, and
:class:`~osprey_data.errors.Interrupted` says which step was kept and how to resume; the CLI
exits 130 / 143. Resuming from that checkpoint is as exact as any other resume. Under DDP/FSDP
the ranks agree on stopping with one small all-reduce per step, so they save the same step. A
second signal stops at once (the newest complete checkpoint stays usable).
"""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from osprey_data.atomic import atomic_dir
from osprey_data.errors import CheckpointError, ConfigError, Interrupted, TrainingDivergedError
from osprey_data.interrupt import GracefulStop, StopRequested, signal_name
from osprey_data.target_model import resolve_precision
from osprey_train.trainer.checkpoint import latest_checkpoint, load_checkpoint, read_trainer_state, save_checkpoint
from osprey_train.trainer.config import LoopConfig, OptimConfig
from osprey_train.trainer.distributed import (
    DistContext, all_reduce_sum, barrier, no_sync, setup_distributed, teardown_distributed, unwrap_model, wrap_model,
)
from osprey_train.trainer.metrics import MetricsLog
from osprey_train.trainer.optim import build_optimizer, lr_at, set_lr
from osprey_train.trainer.run_lock import run_lock

__all__ = ["TrainTask", "TrainResult", "train"]


@runtime_checkable
class TrainTask(Protocol):
    """What a stage must provide to :func:`train` (``trainable_parameters`` is optional)."""

    def build_model(self) -> nn.Module:
        """A fresh model on CPU (called after seeding, identically on every rank)."""

    def batch(self, step: int, micro: int, rank: int, world_size: int) -> Any:
        """The micro-batch ``micro`` of optimizer step ``step`` for ``rank``; deterministic."""

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, float]]:
        """Mean loss of the micro-batch and metrics (``tokens`` counts towards tokens/s)."""

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Held-out metrics (may be ``{}``); runs on rank 0 in eval mode without grad."""

    def save_model(self, model: nn.Module, out_dir: Path) -> None:
        """Write the final model (safetensors + config.json) into ``out_dir``."""

    # Optional: ``perplexity_of`` names the train metric that is a per-token cross-entropy in nats
    # (metrics.png plots its exp as the perplexity); absent or None: no train perplexity is drawn.


@dataclass
class TrainResult:
    """What a finished :func:`train` call reports (eval fields are filled on rank 0)."""

    step: int
    """Optimizer steps completed (== ``max_steps`` after a full run)."""
    out_dir: Path
    """The run folder."""
    final_dir: Path | None
    """Where ``task.save_model`` wrote the final model (rank 0; ``None`` elsewhere)."""
    checkpoint: Path | None
    """The last checkpoint written."""
    resumed_from: Path | None
    """Checkpoint this run resumed from, if any."""
    last_train: dict[str, float] = field(default_factory=dict)
    """The last train metrics record (loss, lr, grad_norm, tokens_per_s, ...)."""
    last_eval: dict[str, float] = field(default_factory=dict)
    """The last evaluation metrics."""
    eval_history: list[dict[str, float]] = field(default_factory=list)
    """Every evaluation of this invocation, each with its ``step``."""
    tokens_seen: int = 0
    """Tokens trained on over the whole run (all ranks, across resumes)."""
    tokens_per_s: float = 0.0
    """Training throughput of this invocation (all ranks; excludes eval and checkpoint time)."""
    train_s: float = 0.0
    """Seconds spent in training steps in this invocation."""
    precision: str = ""
    """The precision the run trained in (``LoopConfig.precision`` with ``auto`` resolved)."""
    wall_s: float = 0.0
    """Total seconds of this invocation."""
    metrics_path: Path | None = None
    """``metrics.jsonl``."""
    plot_path: Path | None = None
    """``metrics.png``."""


# --- helpers -------------------------------------------------------------------------------------


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        moved = [_to_device(v, device) for v in obj]
        return type(obj)(moved) if not hasattr(obj, "_fields") else type(obj)(*moved)
    if hasattr(obj, "to") and callable(obj.to) and not isinstance(obj, nn.Module):
        return obj.to(device)
    return obj


def _enable_gradient_checkpointing(task: Any, model: nn.Module) -> None:
    if hasattr(task, "enable_gradient_checkpointing"):
        task.enable_gradient_checkpointing(model)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise ConfigError(f"gradient_checkpointing=True but {type(model).__name__} has no "
                          "gradient_checkpointing_enable() and the task no enable_gradient_checkpointing()")


_RESUME_KEYS = ("max_steps", "grad_accum", "seed", "world_size", "distributed")


def _check_resume(doc: dict[str, Any], expected: dict[str, Any], ckpt: Path) -> None:
    diffs = [f"{k}: checkpoint {doc.get(k)!r} vs now {expected[k]!r}"
             for k in (*_RESUME_KEYS, "optim") if doc.get(k) != expected[k]]
    if diffs:
        raise CheckpointError(f"{ckpt}: cannot resume, the run settings changed ({'; '.join(diffs)}); "
                              "resume with the original settings or start a fresh --out")


class _Accumulator:
    """Sums per-micro metrics between two flushes without syncing the device every step."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss_sum: Tensor | None = None
        self.grad_norm: Tensor | None = None
        self.micros = 0
        self.steps = 0
        self.sums: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def add_micro(self, loss: Tensor, metrics: dict[str, float]) -> None:
        detached = loss.detach().float()
        self.loss_sum = detached if self.loss_sum is None else self.loss_sum + detached
        self.micros += 1
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value)


# --- the loop ------------------------------------------------------------------------------------


def train(task: TrainTask, loop: LoopConfig, optim: OptimConfig) -> TrainResult:
    """Train ``task`` as configured; see the module docstring for the contract.

    Raises:
        Interrupted: SIGINT/SIGTERM arrived; the finished steps were checkpointed first.
    """
    ctx = setup_distributed(loop.distributed, loop.device)
    try:
        with run_lock(loop.out_dir, rank=ctx.rank), GracefulStop() as stop:
            check_resume_request(loop)
            try:
                return _Trainer(task, loop, optim, ctx, stop).run()
            except StopRequested as exc:   # before the first step or after the last: nothing unsaved
                raise Interrupted(f"training in {loop.out_dir} interrupted by {signal_name(exc.signum)} "
                                  f"before any step of this run finished; nothing new to save. Rerun the "
                                  f"same command{'' if loop.resuming else ' (with --resume if a checkpoint exists)'}.",
                                  signum=exc.signum) from None
    finally:
        teardown_distributed(ctx)


def check_resume_request(loop: LoopConfig) -> None:
    """Refuse, before any model is built, ``--resume`` on a folder without a checkpoint and a
    fresh start in a folder that holds one."""
    existing = latest_checkpoint(loop.out_dir / "checkpoints")
    if existing is not None and loop.resuming:
        step = read_trainer_state(existing)["step"]
        if step > loop.max_steps:
            raise CheckpointError(f"{existing}: the checkpoint is at step {step}, beyond --steps {loop.max_steps}; "
                                  "resume with the run's own --steps or start a fresh --out")
    if existing is None and loop.resume and not loop.resume_if_any:
        raise ConfigError(f"--resume: {loop.out_dir / 'checkpoints'} holds no complete checkpoint, so there is "
                          f"nothing to continue; check --out, drop --resume to start from step 0, or pass "
                          f"--resume-if-any to start fresh when there is none")
    if existing is not None and not loop.resuming:
        raise ConfigError(f"{loop.out_dir} already holds checkpoints (newest {existing.name}); "
                          "pass --resume to continue that run or choose another --out")


class _Trainer:
    def __init__(self, task: TrainTask, loop: LoopConfig, optim: OptimConfig, ctx: DistContext,
                 stop: GracefulStop) -> None:
        self.task, self.loop, self.optim, self.ctx, self.stop = task, loop, optim, ctx, stop
        self.ckpt_root = loop.out_dir / "checkpoints"
        self.precision = resolve_precision(loop.precision, str(ctx.device), training=True,
                                           what="LoopConfig.precision")

    # -- setup --
    def _build(self) -> None:
        loop, ctx = self.loop, self.ctx
        _seed_all(loop.seed)   # same init on every rank
        model = self.task.build_model()
        if loop.gradient_checkpointing:
            _enable_gradient_checkpointing(self.task, model)
        model.to(ctx.device)
        model.train()
        self.model = wrap_model(model, ctx, self.task)
        self.inner = unwrap_model(self.model)
        chooser = getattr(self.task, "trainable_parameters", None)
        params = list(chooser(self.inner)) if chooser is not None else None
        self.optimizer = build_optimizer(self.inner, params, self.optim)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]

    def _identity(self) -> dict[str, Any]:
        return {"max_steps": self.loop.max_steps, "grad_accum": self.loop.grad_accum, "seed": self.loop.seed,
                "world_size": self.ctx.world_size, "distributed": self.ctx.mode, "optim": self.optim.to_dict()}

    def _maybe_resume(self) -> tuple[int, int, Path | None]:
        existing = latest_checkpoint(self.ckpt_root)
        if existing is None:
            _seed_all(self.loop.seed + 1000003 * self.ctx.rank + 1)   # per-rank streams (dropout, sampling)
            return 0, 0, None
        if not self.loop.resuming:
            raise ConfigError(f"{self.loop.out_dir} already holds checkpoints (newest {existing.name}); "
                              "pass --resume to continue that run or choose another --out")
        doc = read_trainer_state(existing)
        _check_resume(doc, self._identity(), existing)
        doc = load_checkpoint(existing, self.model, self.optimizer, self.ctx)
        return int(doc["step"]), int(doc["tokens_seen"]), existing

    # -- pieces of a step --
    def _evaluate(self, step: int) -> dict[str, float]:
        # FSDP forward passes are collective: every rank evaluates, rank 0 reports.
        if not (self.ctx.is_main or self.ctx.mode == "fsdp"):
            return {}
        self.inner.eval()
        try:
            with torch.no_grad(), self.precision.context():
                result = {k: float(v) for k, v in (self.task.evaluate(self.inner) or {}).items()}
        finally:
            self.inner.train()
        if not self.ctx.is_main:
            return {}
        self.log.log({"kind": "eval", "step": step, **result})
        return result

    def _flush(self, acc: _Accumulator, step: int, lr: float) -> dict[str, float]:
        keys = sorted(acc.sums)
        local = torch.tensor([float(acc.loss_sum.item()) if acc.loss_sum is not None else 0.0, float(acc.micros),
                              *[acc.sums[k] for k in keys]], dtype=torch.float64)
        if self.ctx.collective:
            local = local.to(self.ctx.device)
        total = all_reduce_sum(local, self.ctx).cpu()
        seconds = max(time.perf_counter() - acc.t0, 1e-9)
        micros = max(total[1].item(), 1.0)
        record: dict[str, float] = {"loss": total[0].item() / micros, "lr": lr}
        if acc.grad_norm is not None:
            record["grad_norm"] = float(acc.grad_norm.item())
        for i, key in enumerate(keys):
            value = total[2 + i].item()
            record[key] = value if key == "tokens" else value / micros
        tokens = int(round(record.get("tokens", 0.0)))
        record["tokens_per_s"] = tokens / seconds
        if not math.isfinite(record["loss"]) or not math.isfinite(record.get("grad_norm", 0.0)):
            raise TrainingDivergedError(f"step {step}: loss={record['loss']} grad_norm={record.get('grad_norm')} "
                                        "is not finite; lower --lr or inspect the batch of this step")
        self.tokens_seen += tokens
        self.train_tokens += tokens
        record["tokens_seen"] = self.tokens_seen
        self.log.log({"kind": "train", "step": step, **record})
        acc.reset()
        return record

    def _save(self, step: int, last_train: dict[str, float]) -> Path:
        state = dict(self._identity())
        state.update({"tokens_seen": self.tokens_seen, "last_metrics": last_train, "precision": self.precision.name,
                      "extra": dict(self.loop.extra)})
        return save_checkpoint(self.ckpt_root, step, self.model, self.optimizer, state, self.ctx,
                               keep=self.loop.keep_checkpoints)

    def _save_final(self) -> Path | None:
        final = self.loop.out_dir / "final"
        if self.ctx.mode == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if not self.ctx.is_main:
                return None
            to_save = self.task.build_model()
            to_save.load_state_dict(full)
        else:
            if not self.ctx.is_main:
                return None
            to_save = self.inner
        with atomic_dir(final, overwrite=True) as tmp:   # an earlier run's final/ stays until replaced
            self.task.save_model(to_save, tmp)
        return final

    def _stop_agreed(self) -> bool:
        """Whether to stop after the step just finished: a signal reached this process or, under
        DDP/FSDP, any rank (one small all-reduce per step, so every rank saves the same step)."""
        flag = self.stop.requested
        if self.ctx.collective:
            votes = all_reduce_sum(torch.tensor([float(flag)], device=self.ctx.device), self.ctx)
            flag = bool(votes.item() > 0)
        return flag

    def _interrupted(self, result: TrainResult, bar: Any, done: int, saved_step: int | None) -> None:
        """Checkpoint the finished steps (unless that step is already saved) and raise Interrupted."""
        with self.stop.deferred(raise_after=False):
            if bar is not None:
                bar.close()
            if done > (saved_step if saved_step is not None else 0):
                result.checkpoint = self._save(done, result.last_train)
            elif saved_step is None:   # not one step finished and no checkpoint to resume from
                raise StopRequested(self.stop.signum or 15)
            if self.ctx.is_main and self.loop.plot:
                self.log.plot()
            barrier(self.ctx)
        signum = self.stop.signum or 15   # a rank stopped by another rank's signal: as if SIGTERM
        where = result.checkpoint if result.checkpoint is not None else self.ckpt_root
        raise Interrupted(f"training in {self.loop.out_dir} interrupted by {signal_name(signum)} after step "
                          f"{done} of {self.loop.max_steps}: checkpoint {where} kept; rerun the same command with "
                          f"--resume to continue from it.", signum=signum)

    # -- main --
    def run(self) -> TrainResult:
        loop, ctx = self.loop, self.ctx
        wall0 = time.perf_counter()
        if ctx.is_main:
            loop.out_dir.mkdir(parents=True, exist_ok=True)
        barrier(ctx)
        self._build()
        start, self.tokens_seen, resumed_from = self._maybe_resume()
        self.train_tokens = 0
        self.log = MetricsLog(loop.out_dir, enabled=ctx.is_main, resume_step=start if resumed_from else None,
                              perplexity_of=getattr(self.task, "perplexity_of", None))
        result = TrainResult(step=start, out_dir=loop.out_dir, final_dir=None, checkpoint=resumed_from,
                             resumed_from=resumed_from, metrics_path=self.log.path, precision=self.precision.name)
        if loop.eval_at_start and start == 0:
            ev = self._evaluate(0)
            if ev:
                result.last_eval = ev
                result.eval_history.append({"step": 0, **ev})

        bar = None
        if ctx.is_main and loop.progress:
            bar = tqdm(total=loop.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
        acc = _Accumulator()
        train_s = 0.0
        segment0 = time.perf_counter()
        accum = loop.grad_accum
        stop = self.stop
        done, saved_step = start, (start if resumed_from is not None else None)
        stopping = False
        try:
            for step in range(start, loop.max_steps):
                with stop.deferred(raise_after=False):   # a step is finished, never cut in half
                    lr = lr_at(step, self.optim, loop.max_steps)
                    set_lr(self.optimizer, lr)
                    for micro in range(accum):
                        batch = _to_device(self.task.batch(step, micro, ctx.rank, ctx.world_size), ctx.device)
                        with no_sync(self.model, micro < accum - 1), self.precision.context():
                            loss, metrics = self.task.loss(self.model, batch)
                        (loss / accum).backward()
                        acc.add_micro(loss, metrics)
                    if self.optim.grad_clip > 0:
                        acc.grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.optim.grad_clip)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    done = step + 1
                    last = done == loop.max_steps
                    stopping = not last and self._stop_agreed()
                    do_eval = not stopping and (last or (loop.eval_every > 0 and done % loop.eval_every == 0))
                    do_save = last or (loop.save_every > 0 and done % loop.save_every == 0)
                    if last or do_save or stopping or done % loop.log_every == 0:
                        record = self._flush(acc, done, lr)
                        result.last_train = record
                        if bar is not None:
                            bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}",
                                            tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
                    if bar is not None:
                        bar.update(1)
                if stopping:
                    break
                if do_eval or do_save:
                    train_s += time.perf_counter() - segment0
                    if do_eval:
                        # an evaluation in progress is dropped on a signal (the step is already done),
                        # except where it is collective and every rank must take part
                        with stop.deferred() if ctx.mode == "fsdp" else nullcontext():
                            ev = self._evaluate(done)
                        if ev:
                            result.last_eval = ev
                            result.eval_history.append({"step": done, **ev})
                    if do_save:
                        with stop.deferred(raise_after=False):
                            result.checkpoint = self._save(done, result.last_train)
                            saved_step = done
                    if ctx.is_main and loop.plot:
                        result.plot_path = self.log.plot()
                    acc.t0 = segment0 = time.perf_counter()
                if not last and stop.requested and not ctx.collective:  # arrived while saving
                    stopping = True
                    break
        except StopRequested:
            if ctx.collective:  # pragma: no cover - every collective wait above is deferred
                raise
            stopping = True
        if stopping:
            self._interrupted(result, bar, done, saved_step)
        train_s += time.perf_counter() - segment0 if start < loop.max_steps else 0.0
        if bar is not None:
            bar.close()
        result.step = loop.max_steps
        with stop.deferred(raise_after=False):   # the run is complete: save it whatever arrives now
            result.final_dir = self._save_final()
            if ctx.is_main and loop.plot and result.plot_path is None:
                result.plot_path = self.log.plot()
            barrier(ctx)
        result.tokens_seen = self.tokens_seen
        result.train_s = train_s
        result.tokens_per_s = self.train_tokens / train_s if train_s > 0 else 0.0
        result.wall_s = time.perf_counter() - wall0
        return result

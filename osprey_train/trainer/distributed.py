"""Process-group setup and model wrapping for single-process, DDP and FSDP training.

Launch model: ``torchrun`` (or any launcher that sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
``MASTER_ADDR``/``MASTER_PORT``). The backend follows the device: NCCL on CUDA, gloo on CPU.
``distributed="auto"`` means DDP when more than one process was launched, otherwise none.
FSDP uses the composable ``fully_shard`` API (FSDP2): every module that sits in an
``nn.ModuleList`` (the transformer blocks of HF models and of Osprey drafters) becomes a
sharding unit, then the root; a task can override this with ``fsdp_units(model)``.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from osprey_data.errors import BackendUnavailableError, ConfigError

__all__ = ["DistContext", "setup_distributed", "teardown_distributed", "wrap_model", "unwrap_model",
           "resolve_device", "all_reduce_sum", "barrier", "no_sync"]


@dataclass
class DistContext:
    """Where this process sits in the job."""

    mode: str            # "none" | "ddp" | "fsdp"
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool     # True when we created the process group (and must destroy it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def collective(self) -> bool:
        """True when ranks must call collectives together (DDP with >1 rank, or FSDP)."""
        return (self.mode == "ddp" and self.world_size > 1) or self.mode == "fsdp"


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> ``cuda:<local_rank>`` if CUDA is available, else CPU."""
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BackendUnavailableError(f"device {name!r} requested but CUDA is not available; use --device cpu")
        return torch.device(name if ":" in name else f"cuda:{local_rank}")
    return torch.device(name)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def setup_distributed(mode: str, device: str) -> DistContext:
    """Resolve ``mode``/``device`` and initialise the process group if needed."""
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank if world > 1 else 0)
    if mode == "auto":
        mode = "ddp" if world > 1 or (dist.is_available() and dist.is_initialized()
                                      and dist.get_world_size() > 1) else "none"
    if mode == "none":
        if world > 1:
            raise ConfigError(f"distributed='none' but WORLD_SIZE={world}: every rank would train alone; "
                              "use --distributed ddp (or auto)")
        return DistContext("none", 0, 1, 0, resolve_device(device, 0), False)
    if not dist.is_available():
        raise BackendUnavailableError("torch.distributed is not available in this torch build")
    owns = False
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise ConfigError(f"distributed={mode!r} needs a launcher: run under torchrun "
                              "(it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
        dev = resolve_device(device, local_rank)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
        owns = True
    else:
        rank, world = dist.get_rank(), dist.get_world_size()
        dev = resolve_device(device, local_rank)
    return DistContext(mode, rank, world, local_rank, dev, owns)


def teardown_distributed(ctx: DistContext) -> None:
    """Destroy the process group if :func:`setup_distributed` created it."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def _fsdp_units(model: nn.Module) -> list[nn.Module]:
    units = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            units.extend(module)
    return units


def wrap_model(model: nn.Module, ctx: DistContext, task: Any = None) -> nn.Module:
    """Wrap for DDP / FSDP (model must already be on ``ctx.device``)."""
    if ctx.mode == "ddp" and ctx.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    if ctx.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        units = task.fsdp_units(model) if task is not None and hasattr(task, "fsdp_units") else _fsdp_units(model)
        for unit in units:
            fully_shard(unit)
        fully_shard(model)
        return model
    return model


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 shards in place: returned as is)."""
    return model.module if hasattr(model, "module") and isinstance(
        model, torch.nn.parallel.DistributedDataParallel) else model


def no_sync(model: nn.Module, enabled: bool):
    """Skip the DDP gradient all-reduce on non-final micro-batches of an accumulation."""
    if enabled and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    if enabled and hasattr(model, "set_requires_gradient_sync"):   # FSDP2
        model.set_requires_gradient_sync(False)
        return _ResyncFSDP(model)
    return nullcontext()


class _ResyncFSDP:
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.model.set_requires_gradient_sync(True)


def all_reduce_sum(values: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum a tensor over ranks (identity when not distributed)."""
    if ctx.collective:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op when not distributed)."""
    if ctx.collective:
        dist.barrier()

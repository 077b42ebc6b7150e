"""Training checkpoints without pickle: safetensors tensors + JSON, written atomically.

Layout of ``<out_dir>/checkpoints/step-<N>/``::

    model.safetensors        full (unsharded) weights; tied tensors stored once (aliases in metadata)
    optimizer.safetensors    every tensor of the optimizer state, keyed "<param name>/<field>"
    optimizer.json           the rest: param groups (hyper-parameters, names) and scalar state
    rng/rank-<R>.json        python / numpy / torch (CPU, CUDA) RNG states of rank R
    trainer_state.json       step, run identity, file names (schemas/trainer-state.v1.json)

A checkpoint is assembled in ``.tmp-step-<N>`` and renamed into place only when complete, so
any ``step-<N>`` folder is usable and :func:`latest_checkpoint` never picks a partial one.
``trainer_state.json`` keeps the sha256 of every other file, checked before a resume loads
anything: one flipped bit in a weight is a :class:`CheckpointError`, never trained on. The file
names it lists must be plain names inside the folder (schema pattern), and its step may not
exceed its ``max_steps``.
Optimizer state is keyed by parameter NAME, not position, so a checkpoint from a model whose
parameters changed fails with a clear :class:`CheckpointError` instead of loading garbage.
"""

from __future__ import annotations

import base64
import json
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from osprey_data.atomic import replace_dir
from osprey_data import jsonio
from osprey_data.digest import file_sha256
from osprey_data.errors import CheckpointError
from osprey_data.schema_check import validate
from osprey_train.models.io import write_safetensors
from osprey_train.trainer.distributed import DistContext, barrier, unwrap_model

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "list_checkpoints",
           "rng_state", "set_rng_state", "TRAINER_STATE_SCHEMA", "save_state_dict", "load_state_dict_file"]

TRAINER_STATE_SCHEMA = "trainer-state.v1.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


# --- weights -----------------------------------------------------------------------------------


def save_state_dict(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Save a state dict to safetensors; tensors sharing storage (tied weights) are stored once."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        t = tensor.detach()
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.cpu().contiguous()
    meta = dict(metadata or {})
    meta["osprey_aliases"] = json.dumps(aliases)
    write_safetensors(tensors, path, metadata=meta)   # a full disk: one CheckpointError naming the file


def load_state_dict_file(path: Path) -> dict[str, torch.Tensor]:
    """Inverse of :func:`save_state_dict` (aliases restored as the same tensor)."""
    state = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    for alias, target in json.loads(meta.get("osprey_aliases", "{}")).items():
        state[alias] = state[target]
    return state


def _model_state(model: nn.Module, ctx: DistContext) -> dict[str, torch.Tensor]:
    if ctx.mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return unwrap_model(model).state_dict()


def _load_model_state(model: nn.Module, state: dict[str, torch.Tensor], ctx: DistContext, where: Path) -> None:
    if ctx.mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
        return
    try:
        unwrap_model(model).load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{where}: weights do not match the model being trained ({str(exc).splitlines()[0]} ...); "
                              "resume with the same model and stage config, or start a fresh --out") from exc


# --- optimizer ---------------------------------------------------------------------------------


def _param_names(optimizer: torch.optim.Optimizer) -> list[str]:
    names: list[str] = []
    for group in optimizer.param_groups:
        names.extend(group.get("names") or [f"param{len(names) + i}" for i in range(len(group["params"]))])
    return names


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext) -> dict[str, Any]:
    if ctx.mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    sd = optimizer.state_dict()
    names = _param_names(optimizer)
    # Re-key positional state by parameter name (robust, self-describing).
    return {"state": {names[i]: v for i, v in sd["state"].items()}, "param_groups": sd["param_groups"]}


def _split_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pname, fields in state["state"].items():
        for field_name, value in fields.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pname}/{field_name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pname), {})[field_name] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _join_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        pname, field_name = key.rsplit("/", 1)
        state.setdefault(pname, {})[field_name] = value
    for pname, fields in meta["scalars"].items():
        state.setdefault(pname, {}).update(fields)
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def _load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                          ctx: DistContext, where: Path) -> None:
    if ctx.mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
        return
    names = _param_names(optimizer)
    saved_names = [n for g in state["param_groups"] for n in (g.get("names") or [])]
    if saved_names and saved_names != names:
        missing = sorted(set(names) - set(saved_names))[:3]
        extra = sorted(set(saved_names) - set(names))[:3]
        raise CheckpointError(f"{where}: optimizer state is for other parameters (missing {missing}, "
                              f"unexpected {extra}); resume with the same model and trainable set")
    index = {n: i for i, n in enumerate(names)}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for n, fields_ in state["state"].items():
        if n not in index:
            raise CheckpointError(f"{where}: optimizer state names parameter {n!r}, which the model being "
                                  "trained has not; resume with the same model and trainable set")
        for key, v in fields_.items():
            if torch.is_tensor(v) and v.dim() > 0 and tuple(v.shape) != tuple(params[index[n]].shape):
                raise CheckpointError(f"{where}: optimizer state {key!r} of {n} has shape {tuple(v.shape)}, the "
                                      f"parameter has {tuple(params[index[n]].shape)}; the checkpoint is damaged "
                                      "or of another model — delete this folder or start a fresh --out")
    positional = {index[n]: v for n, v in state["state"].items()}
    groups = state["param_groups"]
    try:
        optimizer.load_state_dict({"state": positional, "param_groups": groups})
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"{where}: optimizer state does not fit this optimizer ({exc}); resume with the "
                              "same model and settings, or delete this folder") from None


# --- RNG ---------------------------------------------------------------------------------------


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rng_state() -> dict[str, Any]:
    """JSON-serialisable snapshot of the python, numpy and torch RNGs of this process."""
    py = random.getstate()
    np_state = np.random.get_state()
    out: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch_cpu": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch_cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a snapshot from :func:`rng_state`."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(_unb64(state["torch_cpu"]))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["torch_cuda"]])


# --- checkpoint folders --------------------------------------------------------------------------


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as (step, path), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir() and (child / "trainer_state.json").is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (``None`` if there is none)."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def save_checkpoint(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    trainer_state: dict[str, Any], ctx: DistContext, *, keep: int = 0) -> Path:
    """Write ``root/step-<step>`` atomically; collective (call on every rank). Returns the path."""
    root = Path(root)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    if ctx.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "rng").mkdir(parents=True)
    barrier(ctx)
    (tmp / "rng" / f"rank-{ctx.rank}.json").write_text(json.dumps(rng_state()), encoding="utf-8")
    model_state = _model_state(model, ctx)            # collective under FSDP
    optim_state = _optimizer_state(model, optimizer, ctx)
    if ctx.is_main:
        save_state_dict(model_state, tmp / "model.safetensors")
        tensors, meta = _split_optimizer(optim_state)
        write_safetensors(tensors, tmp / "optimizer.safetensors")
        (tmp / "optimizer.json").write_text(json.dumps(meta), encoding="utf-8")
        doc = dict(trainer_state)
        doc.update({"format": "osprey-trainer-state", "version": 1, "step": step, "created_unix": time.time(),
                    "files": {"model": "model.safetensors", "optimizer_tensors": "optimizer.safetensors",
                              "optimizer_meta": "optimizer.json",
                              "rng": [f"rng/rank-{r}.json" for r in range(ctx.world_size)]}})
        validate(doc, TRAINER_STATE_SCHEMA, where=str(final / "trainer_state.json"))
    barrier(ctx)   # every rank's RNG file is in place before the folder becomes visible
    if ctx.is_main:
        doc["sha256"] = {rel: file_sha256(tmp / rel) for rel in _file_names(doc["files"])}
        (tmp / "trainer_state.json").write_text(json.dumps(doc, indent=2, default=str), encoding="utf-8")
        replace_dir(tmp, final)   # a checkpoint of the same step is replaced, never deleted first
        if keep > 0:
            for _, old in list_checkpoints(root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    barrier(ctx)
    return final


def _file_names(files: dict[str, Any]) -> list[str]:
    return [files["model"], files["optimizer_tensors"], files["optimizer_meta"], *files["rng"]]


def verify_checkpoint(path: Path, doc: dict[str, Any]) -> None:
    """CheckpointError unless every file ``doc`` lists has the sha256 it recorded (checkpoints
    written before checksums existed have none to check)."""
    sums = doc.get("sha256")
    if sums is None:
        return
    for rel in _file_names(doc["files"]):
        if rel not in sums:
            raise CheckpointError(f"{path}/trainer_state.json: no sha256 for {rel}; the checkpoint is incomplete "
                                  "or edited — delete this folder to resume from the previous checkpoint")
        try:
            actual = file_sha256(path / rel)
        except OSError as exc:
            raise CheckpointError(f"{path / rel}: unreadable ({exc}); delete this folder to resume from the "
                                  "previous checkpoint") from None
        if actual != sums[rel]:
            raise CheckpointError(f"{path / rel}: damaged (sha256 differs from the one trainer_state.json "
                                  "recorded when it was saved); delete this folder to resume from the previous "
                                  "checkpoint")


def read_trainer_state(path: Path) -> dict[str, Any]:
    """Parse and validate ``path/trainer_state.json`` (bounded JSON reader, schema, step range)."""
    state_file = Path(path) / "trainer_state.json"
    try:
        doc = jsonio.loads(state_file.read_bytes())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{state_file}: cannot read trainer state ({exc}); delete this checkpoint folder") from None
    validate(doc, TRAINER_STATE_SCHEMA, where=str(state_file))
    if doc["step"] > doc["max_steps"]:
        raise CheckpointError(f"{state_file}: saved at step {doc['step']} of a run of {doc['max_steps']} steps; "
                              "the checkpoint is damaged or edited — delete this folder")
    m = _STEP_DIR.match(Path(path).name)
    if m and int(m.group(1)) != doc["step"]:
        raise CheckpointError(f"{state_file}: says step {doc['step']} but its folder is {Path(path).name}; "
                              "the checkpoint is damaged or edited — delete this folder")
    return doc


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext,
                    *, restore_rng: bool = True) -> dict[str, Any]:
    """Restore weights, optimizer and (this rank's) RNG state from ``path``; returns the trainer state."""
    path = Path(path)
    doc = read_trainer_state(path)
    if doc["world_size"] != ctx.world_size:
        raise CheckpointError(f"{path}: written by {doc['world_size']} process(es) but this run has "
                              f"{ctx.world_size}; resume with the same number of processes")
    verify_checkpoint(path, doc)
    files = doc["files"]
    try:
        model_state = load_state_dict_file(path / files["model"])
        tensors = load_file(str(path / files["optimizer_tensors"]))
        meta = jsonio.loads((path / files["optimizer_meta"]).read_bytes())
        rng = jsonio.loads((path / files["rng"][ctx.rank]).read_bytes())
    except (OSError, json.JSONDecodeError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: checkpoint file unreadable ({exc}); delete this folder to resume "
                              "from the previous checkpoint") from exc
    for what, state, rel in (("weight", model_state, files["model"]), ("optimizer state", tensors,
                                                                    files["optimizer_tensors"])):
        for name, t in state.items():   # else the first step diverges and the message blames --lr
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{path / rel}: {what} {name} holds NaN/inf; the run had diverged when "
                                      "this was saved: delete this folder to resume from the previous checkpoint")
    _load_model_state(model, model_state, ctx, path)
    _load_optimizer_state(model, optimizer, _join_optimizer(tensors, meta), ctx, path)
    if restore_rng:
        try:
            set_rng_state(rng)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{path / files['rng'][ctx.rank]}: not a valid RNG state ({type(exc).__name__}: "
                                  f"{exc}); delete this folder to resume from the previous checkpoint") from None
    return doc

"""Checkpoint files: safetensors + JSON only, atomic folders, tied weights, RNG, bad files."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from osprey_data.errors import CheckpointError, SchemaError
from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.checkpoint import (
    latest_checkpoint, list_checkpoints, load_state_dict_file, read_trainer_state, rng_state, save_state_dict,
    set_rng_state,
)
from osprey_train.trainer.loop import train
from tests.train.trainer.toy import ToyLM, ToyTask


def test_rng_state_roundtrip():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    snap = json.loads(json.dumps(rng_state()))          # must survive JSON
    a = (random.random(), np.random.rand(), torch.rand(3))
    set_rng_state(snap)
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_tied_weights_saved_once_and_restored(tmp_path):
    model = ToyLM()
    model.head.weight = model.embed.weight
    save_state_dict(model.state_dict(), tmp_path / "m.safetensors")
    state = load_state_dict_file(tmp_path / "m.safetensors")
    assert state["head.weight"] is state["embed.weight"]
    fresh = ToyLM()
    fresh.head.weight = fresh.embed.weight
    fresh.load_state_dict(state)
    assert torch.equal(fresh.head.weight, model.embed.weight)


def test_checkpoint_folder_contents_and_latest(tmp_path):
    loop = LoopConfig(out_dir=tmp_path, max_steps=4, save_every=2, progress=False, device="cpu", plot=False,
                      keep_checkpoints=0)
    train(ToyTask(), loop, OptimConfig())
    root = tmp_path / "checkpoints"
    assert [s for s, _ in list_checkpoints(root)] == [2, 4]
    ckpt = root / "step-4"
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.safetensors", "optimizer.json", "optimizer.safetensors",
                                                       "rng", "trainer_state.json"]
    doc = read_trainer_state(ckpt)
    assert doc["step"] == 4 and doc["optim"]["betas"] == [0.9, 0.95] and doc["tokens_seen"] == 4 * 4 * 8
    # A half-written checkpoint (temp name, or no trainer_state.json) is never picked.
    (root / ".tmp-step-6").mkdir()
    (root / "step-8").mkdir()
    (root / "step-8" / "model.safetensors").write_bytes(b"partial")
    assert latest_checkpoint(root) == ckpt


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    loop = LoopConfig(out_dir=tmp_path, max_steps=4, save_every=2, progress=False, device="cpu", plot=False,
                      keep_checkpoints=0)
    train(ToyTask(), loop, OptimConfig())
    ckpt = tmp_path / "checkpoints" / "step-4"
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 20)
    again = LoopConfig(out_dir=tmp_path, max_steps=4, save_every=2, progress=False, device="cpu", plot=False,
                       resume=True)
    with pytest.raises(CheckpointError, match="step-4"):
        train(ToyTask(), again, OptimConfig())
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["step"] = -1
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(SchemaError, match="trainer_state.json"):
        train(ToyTask(), again, OptimConfig())


def test_checkpoint_of_another_model_is_refused(tmp_path):
    loop = LoopConfig(out_dir=tmp_path, max_steps=2, progress=False, device="cpu", plot=False)
    train(ToyTask(), loop, OptimConfig())
    bigger = LoopConfig(out_dir=tmp_path, max_steps=2, progress=False, device="cpu", plot=False, resume=True)
    with pytest.raises(CheckpointError, match="do not match"):
        train(ToyTask(dim=24), bigger, OptimConfig())

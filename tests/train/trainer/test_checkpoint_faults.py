"""Fault-round findings of issue #25 against trainer checkpoints: checksums (item 13), file names
from trainer_state.json (item 17), one-line errors instead of tracebacks (item 18), a saved step
beyond the run's steps (item 12)."""

from __future__ import annotations

import json
import struct

import pytest
from safetensors import safe_open

from osprey_data.errors import CheckpointError, OspreyError
from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.loop import train
from tests.train.trainer.toy import ToyTask


def _loop(tmp_path, **kw):
    base = dict(out_dir=tmp_path, max_steps=4, save_every=2, progress=False, device="cpu", plot=False,
                keep_checkpoints=0)
    base.update(kw)
    return LoopConfig(**base)


@pytest.fixture()
def ckpt(tmp_path):
    train(ToyTask(), _loop(tmp_path), OptimConfig())
    return tmp_path / "checkpoints" / "step-4"


def _resume(tmp_path):
    return train(ToyTask(), _loop(tmp_path, resume=True), OptimConfig())


def _state(ckpt):
    return json.loads((ckpt / "trainer_state.json").read_text())


def _write_state(ckpt, doc):
    (ckpt / "trainer_state.json").write_text(json.dumps(doc))


def test_one_flipped_exponent_bit_in_a_checkpoint_is_caught(tmp_path, ckpt):
    path = ckpt / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        name = next(iter(f.keys()))
    raw = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + header_len])
    start = 8 + header_len + header[name]["data_offsets"][0]
    raw[start + 3] ^= 0x40  # the top exponent bit of the first float32: 1e-2 becomes ~1e36
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"step-4.*model.safetensors.*sha256"):
        _resume(tmp_path)


@pytest.mark.parametrize("rel", ["optimizer.json", "rng/rank-0.json"])
def test_damaged_small_checkpoint_files_are_caught(tmp_path, ckpt, rel):
    path = ckpt / rel
    path.write_text(path.read_text().replace("0", "1", 1))
    with pytest.raises(CheckpointError, match=rf"{rel}.*sha256"):
        _resume(tmp_path)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "sub/../model.safetensors"])
def test_file_names_leaving_the_checkpoint_are_refused(tmp_path, ckpt, bad):
    doc = _state(ckpt)
    doc["files"]["model"] = bad
    _write_state(ckpt, doc)
    with pytest.raises(OspreyError, match="trainer_state.json"):
        _resume(tmp_path)


def test_saved_step_beyond_the_run_is_an_error(tmp_path, ckpt):
    doc = _state(ckpt)
    doc["step"] = 9
    _write_state(ckpt, doc)
    with pytest.raises(CheckpointError, match=r"step 9.*4 steps"):
        _resume(tmp_path)


def test_bad_rng_state_is_one_clear_error(tmp_path, ckpt):
    doc = _state(ckpt)
    (ckpt / "rng" / "rank-0.json").write_text(json.dumps({"python": [3, [1, 2], None], "numpy": [], "torch_cpu": "AA=="}))
    doc.pop("sha256", None)  # as an older checkpoint without checksums: the content check itself must hold
    _write_state(ckpt, doc)
    with pytest.raises(CheckpointError, match=r"rank-0.json.*RNG state"):
        _resume(tmp_path)


def test_optimizer_state_of_another_shape_is_one_clear_error(tmp_path, ckpt):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / "optimizer.safetensors"))
    key = next(iter(tensors))
    tensors[key] = tensors[key].flatten()[:1].clone()
    save_file(tensors, str(ckpt / "optimizer.safetensors"))
    doc = _state(ckpt)
    doc.pop("sha256", None)
    _write_state(ckpt, doc)
    with pytest.raises(CheckpointError, match=rf"optimizer state.*{key.split('/')[0]}.*shape"):
        _resume(tmp_path)


def test_a_full_disk_while_saving_a_checkpoint_is_one_clear_error(tmp_path, monkeypatch):
    """safetensors raises its own SafetensorError (no OSError) on ENOSPC; the trainer names the file."""
    from safetensors import SafetensorError

    from osprey_train.models import io as model_io

    def full(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(model_io, "save_file", full)
    with pytest.raises(CheckpointError, match=r"\.tmp-step-2/model.safetensors: cannot write .*No space left.*"
                                              r"free disk space"):
        train(ToyTask(), _loop(tmp_path), OptimConfig())
    assert not (tmp_path / "checkpoints" / "step-2").exists()   # nothing half-written looks complete


@pytest.mark.parametrize("rel", ["optimizer.safetensors", "model.safetensors"])
def test_nan_in_a_saved_state_is_named_not_blamed_on_the_learning_rate(tmp_path, ckpt, rel):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / rel))
    key = sorted(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1)[0]
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = float("nan")
    metadata = None
    if rel == "model.safetensors":
        from safetensors import safe_open

        with safe_open(str(ckpt / rel), framework="pt") as f:
            metadata = f.metadata()
    save_file(tensors, str(ckpt / rel), metadata=metadata)
    doc = _state(ckpt)
    doc.pop("sha256", None)   # as if saved so: the content check itself must hold
    _write_state(ckpt, doc)
    with pytest.raises(CheckpointError, match=rf"{rel}: .* {key} holds NaN/inf; the run had diverged"):
        _resume(tmp_path)

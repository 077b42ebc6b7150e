"""Drafter checkpoints: save/load round trip gives identical tensors and outputs; bad folders fail clearly."""

from __future__ import annotations

import json

import pytest
import torch

from osprey_data.errors import CheckpointError, ConfigError, SchemaError
from osprey_data.target_model import TapLayers, TargetIdentity
from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.models import CausalAttention, DrafterConfig, load_drafter, save_drafter


def _model(preset):
    torch.manual_seed(0)
    config = DrafterConfig.from_name(preset, target=TargetIdentity(name_or_path="t", model_type="llama",
                                                                   config_hash="c", tokenizer_hash="h",
                                                                   vocab_size=384, hidden_size=64,
                                                                   num_layers=6, dtype="float32"))
    model = (Eagle3Drafter if config.arch == "eagle3" else OspreyDrafter)(config).eval()
    if config.arch == "eagle3":
        model.set_draft_vocab(torch.arange(0, 384, 3)[:128])
    return model


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3", "tiny-eagle3"])
def test_round_trip_identical_weights_and_outputs(tmp_path, preset):
    model = _model(preset)
    out = save_drafter(model, tmp_path / "ckpt")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_drafter(out)
    assert type(loaded) is type(model) and loaded.config == model.config
    for (name, a), (name_b, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name_b and a.dtype == b.dtype and torch.equal(a, b), name
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (2, 6))
    taps = torch.randn(2, 6, cfg.num_taps, cfg.target_hidden_size)
    pos = torch.arange(6)[None].expand(2, 6)
    with torch.no_grad():
        a = model.logits(model.forward_hidden(ids, model.fuse_taps(taps), pos, CausalAttention()))
        b = loaded.logits(loaded.forward_hidden(ids, loaded.fuse_taps(taps), pos, CausalAttention()))
    assert torch.equal(a, b)
    if cfg.arch == "eagle3":
        assert torch.equal(loaded.draft_to_target, torch.arange(0, 384, 3)[:128])
        assert loaded.draft_to_target.dtype == torch.long
        assert not loaded.embed_tokens.weight.requires_grad


def test_save_into_existing_folder_keeps_other_files(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "alignment_stats.json").write_text("{}")
    save_drafter(_model("tiny"), out)
    assert (out / "alignment_stats.json").exists() and (out / "config.json").exists()
    assert not list(out.glob(".*tmp*"))


def test_load_with_dtype_keeps_integer_buffers(tmp_path):
    save_drafter(_model("tiny-eagle3"), tmp_path / "c")
    loaded = load_drafter(tmp_path / "c", dtype=torch.bfloat16)
    assert loaded.fc.weight.dtype == torch.bfloat16 and loaded.d2t.dtype == torch.long


def test_bad_checkpoints_fail_clearly(tmp_path):
    out = save_drafter(_model("tiny"), tmp_path / "c")
    doc = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**doc, "num_layers": "two"}))
    with pytest.raises(SchemaError, match="num_layers"):
        load_drafter(out)
    (out / "config.json").write_text(json.dumps({**doc, "num_layers": 3}))
    with pytest.raises(CheckpointError, match="missing"):
        load_drafter(out)
    (out / "config.json").write_text(json.dumps({**doc, "hidden_size": 32, "num_attention_heads": 2,
                                                   "num_key_value_heads": 2}))
    with pytest.raises(CheckpointError, match="shape"):
        load_drafter(out)
    (out / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="not an Osprey drafter"):
        load_drafter(out)
    (out / "config.json").write_text(json.dumps(doc))
    (out / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="damaged"):
        load_drafter(out)
    with pytest.raises(CheckpointError, match="no drafter config"):
        load_drafter(tmp_path / "nowhere")


def test_config_json_holds_typed_taps_and_target_and_reads_the_old_form(tmp_path):
    """tap_layers and target are typed in memory and plain JSON on disk; num_taps is derived."""
    model = _model("tiny")
    out = save_drafter(model, tmp_path / "c")
    doc = json.loads((out / "config.json").read_text())
    assert doc["tap_layers"] == {"layer_ids": [2, 3, 4], "convention": "hf_hidden_states"}
    assert doc["target"]["tokenizer_hash"] == "h" and "num_taps" not in doc
    config = load_drafter(out).config
    assert isinstance(config.tap_layers, TapLayers) and isinstance(config.target, TargetIdentity)
    assert config.num_taps == 3
    # A config written before num_taps became derived still loads when it agrees ...
    (out / "config.json").write_text(json.dumps({**doc, "num_taps": 3}))
    assert load_drafter(out).config == config
    # ... and says what to fix when it does not.
    (out / "config.json").write_text(json.dumps({**doc, "num_taps": 2}))
    with pytest.raises(ConfigError, match="num_taps=2 disagrees"):
        load_drafter(out)
    partial = {k: v for k, v in doc["target"].items() if k != "dtype"}
    (out / "config.json").write_text(json.dumps({**doc, "target": partial}))
    with pytest.raises(SchemaError, match="target"):
        load_drafter(out)


def test_config_refuses_untyped_taps():
    with pytest.raises(ConfigError, match="TapLayers"):
        DrafterConfig.from_name("tiny", tap_layers={"layer_ids": [2, 3, 4]})


def test_config_with_bad_taps_is_refused_naming_the_file(tmp_path):
    out = save_drafter(_model("tiny"), tmp_path / "c")
    doc = json.loads((out / "config.json").read_text())
    for ids, match in (([4, 3, 2], "strictly increasing"), ([2, 3, 3], "strictly increasing"), ([0, 3, 4], ">= 1")):
        (out / "config.json").write_text(json.dumps({**doc, "tap_layers": {"layer_ids": ids,
                                                                           "convention": "hf_hidden_states"}}))
        with pytest.raises(ConfigError, match=f"config.json: drafter config: tap layers .*{match}"):
            load_drafter(out)
    # beyond the recorded target's layers (hidden_states[L] is the final normed state)
    target = {"name_or_path": "t", "model_type": "llama", "config_hash": "c", "tokenizer_hash": "t",
              "vocab_size": 384, "hidden_size": 64, "num_layers": 4, "dtype": "float32"}
    (out / "config.json").write_text(json.dumps({**doc, "target": target}))
    with pytest.raises(ConfigError, match=r"config.json: drafter config: .*outside 1\.\.3"):
        load_drafter(out)

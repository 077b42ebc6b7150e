"""Fault-round items 17-18 of issue #25 against drafter folders: a deeply nested config.json and a
draft vocabulary (d2t) out of range are one CheckpointError, and a drafter's target name cannot
forge lines or escape sequences in the export's README."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from osprey_data.errors import CheckpointError
from osprey_data.target_model import TapLayers
from osprey_train.export import ExportConfig, run
from osprey_train.models import DrafterConfig, load_drafter, save_drafter
from osprey_train.models.io import build_drafter
from tests.train.export.test_export import TARGET


@pytest.fixture(scope="module")
def d2t_drafter(tmp_path_factory):
    root = tmp_path_factory.mktemp("d2t")
    torch.manual_seed(0)
    model = build_drafter(DrafterConfig.from_name("tiny", target=TARGET, tap_layers=TapLayers(layer_ids=(2, 3, 4)),
                                                  draft_vocab_size=128))
    model.set_draft_vocab(torch.arange(128) * 3)
    save_drafter(model, root / "d")
    return root / "d"


def test_a_deeply_nested_config_json_is_one_error(d2t_drafter, tmp_path):
    bad = shutil.copytree(d2t_drafter, tmp_path / "deep")
    (bad / "config.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON .*nested deeper"):
        load_drafter(bad)


@pytest.mark.parametrize(("edit", "pattern"), [
    (lambda d: d.__setitem__(-1, 10**6), r"target ids in \[0, 1000000\], outside the target vocabulary \[0, 384\)"),
    (lambda d: d.__setitem__(0, -5), r"target ids in \[-5, .*\], outside"),
    (lambda d: d.__setitem__(1, 0), r"not strictly increasing"),
])
def test_a_draft_vocabulary_out_of_range_is_one_error(d2t_drafter, tmp_path, edit, pattern):
    bad = shutil.copytree(d2t_drafter, tmp_path / "bad")
    state = load_file(str(bad / "model.safetensors"))
    state["d2t"] = state["d2t"].clone()
    edit(state["d2t"])
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"model.safetensors: draft vocabulary d2t (holds|is) {pattern}"):
        load_drafter(bad)


def test_a_crafted_target_name_cannot_forge_readme_lines(tmp_path):
    crafted = "/models/t`\n# Forged heading\x1b[31m\u202e"
    torch.manual_seed(0)
    target = dataclasses.replace(TARGET, name_or_path=crafted)
    save_drafter(build_drafter(DrafterConfig.from_name("tiny", target=target,
                                                       tap_layers=TapLayers(layer_ids=(2, 3, 4)))), tmp_path / "d")
    out = run(ExportConfig(drafter=tmp_path / "d", format="sglang", out=tmp_path / "e")).out
    readme = (out / "README.md").read_text()
    assert "\x1b" not in readme and "\u202e" not in readme
    assert not any(line.startswith("# Forged") for line in readme.splitlines())
    assert "target: `/models/t'\\n# Forged heading\\x1b[31m\\u202e`; weights: bfloat16." in readme
    assert json.loads((out / "serving.json").read_text())["target"] == crafted   # the data itself is kept


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_a_deeply_nested_target_config_is_one_error(tmp_path, name):
    """Item 18: ``--target-dist full`` reads the target's config.json / weight index itself."""
    from osprey_data.errors import InputError
    from osprey_train.ttt.target_head import load_target_head

    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    (tmp_path / name).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(InputError, match=rf"{name}: not valid JSON .*nested deeper"):
        load_target_head(tmp_path)


def test_a_deeply_nested_export_side_file_is_one_error(tmp_path):
    from osprey_train.export.common import read_json

    (tmp_path / "config.json").write_text("{\"a\": " * 100000 + "1" + "}" * 100000)
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON"):
        read_json(tmp_path / "config.json")

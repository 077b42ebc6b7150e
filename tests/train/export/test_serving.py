"""``osprey export --format sglang`` writes the recommended serving flags: serving.json + README.md."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from osprey_data.errors import ConfigError, InputError, SchemaError
from osprey_data.target_model import TapLayers
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.evaluation.tree_shape import TreeShape
from osprey_train.export import ExportConfig, run
from osprey_train.models import DrafterConfig, save_drafter
from tests.helpers.sweeps import write_sweep
from tests.train.export.test_export import TARGET


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    torch.manual_seed(0)
    save_drafter(OspreyDrafter(DrafterConfig.from_name("tiny", target=TARGET,
                                                        tap_layers=TapLayers(layer_ids=(2, 3, 4)))), root / "d")
    return root / "d"


def test_default_recommendation_is_the_untuned_paper_chain(drafter_dir, tmp_path):
    out = run(ExportConfig(drafter=drafter_dir, format="sglang", out=tmp_path / "e")).out
    doc = json.loads((out / "serving.json").read_text())
    flags = (doc["speculative_num_steps"], doc["speculative_eagle_topk"], doc["speculative_num_draft_tokens"])
    assert flags == (5, 1, 6)
    assert doc["tuned"] is False and "not tuned" in doc["note"]
    assert doc["speculative_algorithm"] == "EAGLE3" and doc["speculative_draft_model_path"] == str(out.resolve())
    assert doc["env"] == {"SGLANG_EXTERNAL_MODEL_PACKAGE": "osprey_train.drafters.osprey.sglang"}
    assert "--speculative-num-draft-tokens 6" in doc["launch"] and "--model-path /models/target" in doc["launch"]
    readme = (out / "README.md").read_text()
    assert doc["launch"] in readme and "not tuned" in readme


def test_sweep_best_shape_becomes_the_flags(drafter_dir, tmp_path):
    sweep, res = write_sweep(tmp_path / "sweep.json")
    assert res.best.shape == TreeShape(steps=4, topk=2, num_draft_tokens=8)
    result = CliRunner().invoke(_cli(), ["export", "--drafter", str(drafter_dir), "--format", "sglang",
                                         "--out", str(tmp_path / "e"), "--sweep", str(sweep)])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "e" / "serving.json").read_text())
    flags = (doc["speculative_num_steps"], doc["speculative_eagle_topk"], doc["speculative_num_draft_tokens"])
    assert flags == (4, 2, 8)
    assert doc["tuned"] is True and doc["sweep"] == str(sweep)
    assert doc["predicted"]["speedup"] == pytest.approx(res.best.speedup)
    assert "assumed costs" in doc["note"]
    assert f"(tuned, predicted x{res.best.speedup:.3f})" in result.output


def test_a_best_shape_slower_than_plain_decoding_is_not_called_tuned(drafter_dir, tmp_path):
    """Issue #25: flags predicted at x0.87 were labelled "(tuned)"."""
    sweep, res = write_sweep(tmp_path / "slow.json", scale=0.5)   # AL 1.0 / 1.3: every shape slower
    assert res.best.speedup < 1
    result = CliRunner().invoke(_cli(), ["export", "--drafter", str(drafter_dir), "--format", "sglang",
                                         "--out", str(tmp_path / "e"), "--sweep", str(sweep)])
    assert result.exit_code == 0, result.output
    assert "(tuned" not in result.output and "every shape is predicted slower than plain decoding" in result.output
    doc = json.loads((tmp_path / "e" / "serving.json").read_text())
    assert "predicted SLOWER than plain decoding" in doc["note"]
    readme = (tmp_path / "e" / "README.md").read_text()
    assert "least slow shape" in readme and "pip install osprey[" not in readme
    assert 'pip install -e ".[sglang]"' in readme and "not on PyPI" in readme


def test_bad_sweeps_are_refused_before_anything_is_written(drafter_dir, tmp_path):
    no_cost, _ = write_sweep(tmp_path / "nocost.json", cost=False)
    with pytest.raises(ConfigError, match="no best shape"):
        run(ExportConfig(drafter=drafter_dir, format="sglang", out=tmp_path / "a", sweep=no_cost))
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "osprey-tree-sweep"')
    with pytest.raises(InputError, match="broken.json"):
        run(ExportConfig(drafter=drafter_dir, format="sglang", out=tmp_path / "b", sweep=broken))
    other = tmp_path / "other.json"
    other.write_text('{"format": "something else"}')
    with pytest.raises(SchemaError, match="other.json"):
        run(ExportConfig(drafter=drafter_dir, format="sglang", out=tmp_path / "c", sweep=other))
    with pytest.raises(ConfigError, match="--format sglang"):
        ExportConfig(drafter=drafter_dir, format="hf", out=tmp_path / "d", sweep=no_cost)
    assert not any((tmp_path / n).exists() for n in "abcd")


def _cli():
    from osprey_cli.main import cli

    return cli

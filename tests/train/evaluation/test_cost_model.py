"""The cost model: file format, validation, interpolation/refusal, the speedup formula."""

from __future__ import annotations

import json

import pytest

from osprey_data.errors import ConfigError, InputError, SchemaError
from osprey_train.evaluation.cost_model import CostModel, parse_cost
from osprey_train.evaluation.tree_shape import TreeShape

DOC = {"format": "osprey-cost-model", "version": 1, "device": "H100, bf16", "drafter": "d", "target": "t",
       "plain_step": 1.0, "draft_step": 0.1, "verify": {"1": 1.0, "4": 1.06, "8": 1.1, "16": 1.3},
       "round_overhead": 0.05, "plain_step_seconds": 0.007}


def test_round_trip_and_formula(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({**DOC, "measured_by": "benchmarks/live_bench.py"}))  # unknown keys are ignored
    cost = CostModel.load(path)
    assert cost.verify == {1: 1.0, 4: 1.06, 8: 1.1, 16: 1.3} and cost.source == str(path)
    cost.save(tmp_path / "again.json")
    assert CostModel.load(tmp_path / "again.json").to_dict() == cost.to_dict()
    chain = TreeShape.chain(3)  # steps * draft + verify(4) + overhead
    assert cost.round_cost(chain) == pytest.approx(3 * 0.1 + 1.06 + 0.05)
    assert cost.speedup(2.5, chain) == pytest.approx(2.5 / (0.3 + 1.06 + 0.05))
    assert cost.verify_cost(12) == pytest.approx(1.2)  # linear between 8 and 16
    tree = TreeShape(steps=4, topk=4, num_draft_tokens=16)
    assert cost.round_cost(tree) == pytest.approx(0.1 + 3 * 0.1 + 1.3 + 0.05)  # width assumed free
    assert any("topk [4]" in note for note in cost.assumptions([tree]))
    wide = CostModel(**{**cost.__dict__, "draft_step_by_width": {4: 0.14}})
    assert wide.draft_cost(2) == pytest.approx(0.1 + 0.04 / 3) and wide.round_cost(tree) == pytest.approx(
        0.1 + 3 * 0.14 + 1.3 + 0.05)
    assert not wide.assumptions([tree])


def test_missing_sizes_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(DOC))
    cost = CostModel.load(path)
    with pytest.raises(ConfigError, match=r"cost.json.*no verify cost for 32 \(measured: \[1, 4, 8, 16\]\)"):
        cost.round_cost(TreeShape(steps=5, topk=4, num_draft_tokens=32))
    with pytest.raises(ConfigError, match="draft_step_by_width cost for 8"):
        CostModel(**{**cost.__dict__, "draft_step_by_width": {4: 0.14}}).draft_cost(8)


@pytest.mark.parametrize("change,error,match", [
    ({"format": "other"}, SchemaError, "format"),
    ({"draft_step": -1}, SchemaError, "draft_step"),
    ({"verify": {"0": 1.0}}, SchemaError, "verify"),
    ({"verify": {}}, SchemaError, "verify"),
    ({"verify": None, "verify_scale": 0.01}, SchemaError, "verify"),
])
def test_bad_files_are_refused(tmp_path, change, error, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**DOC, **change}))
    with pytest.raises(error, match=match) as info:
        CostModel.load(path)
    assert "bad.json" in str(info.value)


def test_not_json_and_both_verify_forms(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{")
    with pytest.raises(InputError, match="broken.json"):
        CostModel.load(path)
    path.write_text(json.dumps({**DOC, "verify_scale": 0.01}))
    with pytest.raises(ConfigError, match="either"):
        CostModel.load(path)


def test_cost_option_forms(tmp_path):
    preset = parse_cost("example-gpu")
    assert preset.assumed and "not measured" in preset.assumptions([])[0]
    inline = parse_cost("draft_step=0.2,verify_scale=0.5")
    assert inline.verify_cost(3) == pytest.approx(2.0) and inline.round_overhead == 0.0
    path = tmp_path / "c.json"
    path.write_text(json.dumps(DOC))
    assert parse_cost(str(path)).device == "H100, bf16"
    with pytest.raises(ConfigError, match="unknown key 'verify'"):
        parse_cost("draft_step=0.1,verify=2")
    with pytest.raises(ConfigError, match="need draft_step"):
        parse_cost("verify_scale=0.1")
    with pytest.raises(ConfigError, match="not a file, a preset"):
        parse_cost(str(tmp_path / "missing.json"))

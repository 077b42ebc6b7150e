"""Fault-round item 14 of issue #25: NaN / inf never pass: cost models (JSON Schema's ``minimum``
lets NaN through, so the code checks), drafter weights (export and evaluation refuse them naming
the tensor), and sweep rows with an absurd topk never reach the recommended serving flags. Also
item 18: a deeply nested cost / sweep file is one error line, not a RecursionError."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from osprey_cli.main import cli
from safetensors.torch import load_file, save_file

from osprey_data.errors import CheckpointError, ConfigError, InputError, OspreyError, SchemaError
from osprey_data.target_model import TapLayers
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.evaluation.cost_model import CostModel, parse_cost
from osprey_train.evaluation.tree_shape import MAX_TOPK, TreeShape
from osprey_train.export import ExportConfig, run
from osprey_train.export.serving import recommend
from osprey_train.models import DrafterConfig, load_drafter, save_drafter
from tests.train.export.test_export import TARGET
from tests.helpers.sweeps import write_sweep


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("nan")
    torch.manual_seed(0)
    save_drafter(OspreyDrafter(DrafterConfig.from_name("tiny", target=TARGET,
                                                        tap_layers=TapLayers(layer_ids=(2, 3, 4)))), root / "d")
    return root / "d"


def _cost_file(path, **over):
    doc = {"format": "osprey-cost-model", "version": 1, "device": "gpu", "draft_step": 0.1,
           "verify": {"1": 1.0, "64": 1.5}, "round_overhead": 0.05}
    doc.update(over)
    path.write_text(json.dumps(doc))   # json.dumps writes NaN / Infinity, and Python reads them back
    return path


@pytest.mark.parametrize("over", [{"draft_step": float("nan")}, {"round_overhead": float("inf")},
                                  {"verify": {"1": 1.0, "8": float("nan")}}, {"plain_step": float("nan")}])
def test_nan_or_inf_in_a_cost_file_is_refused_naming_the_field(tmp_path, over):
    path = _cost_file(tmp_path / "cost.json", **over)
    with pytest.raises(SchemaError, match=rf"{path}: \$\..* is (nan|inf), not a finite number"):
        parse_cost(str(path))


@pytest.mark.parametrize("text", ["draft_step=nan", "draft_step=0.1,verify_scale=inf",
                                  "draft_step=0.1,round_overhead=nan"])
def test_nan_inline_costs_are_refused(text):
    with pytest.raises(ConfigError, match="not a finite number"):
        parse_cost(text)


def test_nan_in_a_cost_model_built_in_code_is_refused():
    with pytest.raises(ConfigError, match=r"verify\[4\] = nan is not a finite number"):
        CostModel(device="x", draft_step=0.1, verify={1: 1.0, 4: float("nan")})


def test_a_deeply_nested_cost_file_is_one_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(InputError, match=rf"cost model {path}: not valid JSON \(nested deeper"):
        parse_cost(str(path))


def _poison(src, dst, value):
    import shutil

    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    state = load_file(str(weights))
    name = sorted(k for k, v in state.items() if v.is_floating_point())[0]
    state[name] = state[name].clone()
    state[name].view(-1)[3] = value
    save_file(state, str(weights))
    return name


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_drafter_weights_are_refused_naming_the_tensor(drafter_dir, tmp_path, value):
    bad = tmp_path / "bad"
    name = _poison(drafter_dir, bad, value)
    with pytest.raises(CheckpointError, match=rf"tensor {name} holds 1 NaN/inf value"):
        load_drafter(bad)
    with pytest.raises(CheckpointError, match=rf"tensor {name}"):
        run(ExportConfig(drafter=bad, format="sglang", out=tmp_path / "e"))
    assert not (tmp_path / "e").exists()


def test_cli_export_and_eval_of_a_nan_drafter_are_one_line(drafter_dir, tmp_path, tiny_llama_dir, monkeypatch):
    from tests.train.evaluation.store_util import make_store

    # the drafter names another target: the config check (before any load) would refuse it first
    monkeypatch.setattr("osprey_train.evaluation.early_checks.check_compatible", lambda *a, **k: None)
    store = make_store(tmp_path / "store", tiny_llama_dir, num_samples=2, max_new_tokens=4)
    bad = tmp_path / "bad"
    name = _poison(drafter_dir, bad, float("nan"))
    res = CliRunner().invoke(cli, ["export", "--drafter", str(bad), "--format", "hf", "--out", str(tmp_path / "e")])
    assert res.exit_code == 2 and name in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(cli, ["eval", "acceptance", "--drafter", str(bad), "--store", str(store)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"tensor {name} holds 1 NaN/inf" in res.output, res.output


def test_a_sweep_row_with_an_absurd_topk_never_reaches_the_flags(drafter_dir, tmp_path):
    path, _ = write_sweep(tmp_path / "sweep.json")
    doc = json.loads(path.read_text())
    doc["best"]["topk"] = 10**9
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=rf"--sweep {path}: its best shape is not servable .*topk = 1000000000 is "
                                          rf"beyond Osprey's bound of {MAX_TOPK}"):
        recommend(path)
    with pytest.raises(ConfigError, match="topk = 1000000000"):
        run(ExportConfig(drafter=drafter_dir, format="sglang", out=tmp_path / "e", sweep=path))
    assert not (tmp_path / "e").exists()


def test_a_best_topk_beyond_the_draft_vocabulary_is_refused(tmp_path):
    torch.manual_seed(0)
    small = DrafterConfig.from_name("tiny", target=TARGET, tap_layers=TapLayers(layer_ids=(2, 3, 4)),
                                    draft_vocab_size=8)
    from osprey_train.models.io import build_drafter

    save_drafter(build_drafter(small), tmp_path / "d8")
    path, _ = write_sweep(tmp_path / "sweep.json")
    doc = json.loads(path.read_text())
    doc["best"].update(steps=2, topk=16, num_draft_tokens=8)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="topk 16, more than the 8 draft tokens"):
        run(ExportConfig(drafter=tmp_path / "d8", format="sglang", out=tmp_path / "e", sweep=path))


def test_a_nan_speedup_in_a_sweep_file_is_refused(tmp_path):
    path, _ = write_sweep(tmp_path / "sweep.json")
    doc = json.loads(path.read_text())
    doc["best"]["speedup"] = float("nan")
    path.write_text(json.dumps(doc))
    with pytest.raises(OspreyError, match=r"\$\.best\.speedup is nan"):
        recommend(path)


def test_tree_shapes_beyond_the_bounds_are_refused():
    with pytest.raises(ConfigError, match="beyond Osprey's bound"):
        TreeShape(steps=2, topk=10**9, num_draft_tokens=8)
    with pytest.raises(ConfigError, match="beyond Osprey's bound"):
        TreeShape.chain(10**6)

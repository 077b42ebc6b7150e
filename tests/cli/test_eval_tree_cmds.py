"""``osprey eval acceptance --tree`` and ``osprey eval sweep`` through the CLI on a tiny store."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.schema_check import validate


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_llama_dir):
    from tests.train.evaluation.store_util import make_drafter_dir, make_store

    root = tmp_path_factory.mktemp("tree_cli")
    store = make_store(root / "store", tiny_llama_dir, num_samples=3, max_new_tokens=8)
    return make_drafter_dir(root / "drafter", seed=1, store=store), store


def test_acceptance_with_trees(pair):
    drafter, store = pair
    result = CliRunner().invoke(cli, ["eval", "acceptance", "--drafter", str(drafter), "--store", str(store),
                                      "--tree", "2,2,4", "--tree", "3,1,9", "--json"])
    assert result.exit_code == 0, result.output
    assert "adjusts num_draft_tokens 9 to steps + 1 = 4" in result.stderr
    docs = json.loads(result.stdout)
    assert [d["tree"]["num_draft_tokens"] for d in docs] == [4, 4] and docs[1]["tree"]["topk"] == 1
    result = CliRunner().invoke(cli, ["eval", "acceptance", "--drafter", str(drafter), "--store", str(store),
                                      "--tree", "2,2,4", "--steps", "3"])
    assert result.exit_code == 2 and "--steps is for chain drafting" in result.output
    result = CliRunner().invoke(cli, ["eval", "acceptance", "--drafter", str(drafter), "--store", str(store),
                                      "--tree", "2,2,40"])
    assert result.exit_code == 2 and "at most 7" in result.output


def test_sweep_writes_table_json_plot(pair, tmp_path):
    drafter, store = pair
    out = tmp_path / "sweep"
    result = CliRunner().invoke(cli, ["eval", "sweep", "--drafter", str(drafter), "--store", str(store),
                                      "--out", str(out), "--grid-steps", "1,2", "--grid-topk", "1,2",
                                      "--grid-tokens", "4,8", "--cost", "draft_step=0.1,verify_scale=0.02",
                                      "--threads", "1"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "sweep.json").read_text())
    validate(doc, "tree-sweep.v1.json", where="sweep.json")
    shapes = [(r["steps"], r["topk"], r["num_draft_tokens"]) for r in doc["rows"]]
    assert shapes == [(1, 1, 2), (2, 1, 3), (2, 2, 4)]  # (1,2,4) has 2 candidates only; (2,2,8) 6
    best = max(doc["rows"], key=lambda r: r["speedup"])
    md = (out / "sweep.md").read_text()
    assert doc["best"] == best and best["speedup"] < 1   # these costs make every shape slower than plain
    # issue #25: a "best" shape predicted slower than plain decoding is not presented as a win
    assert "Every shape is predicted SLOWER than plain decoding" in md and "Best predicted shape" not in md
    assert "\\n" not in md and "\\n" not in result.output   # no literal backslash-n in the notes
    assert (out / "sweep.png").stat().st_size > 1000
    # without costs: acceptance only, no best shape
    result = CliRunner().invoke(cli, ["eval", "sweep", "--drafter", str(drafter), "--store", str(store),
                                      "--out", str(tmp_path / "plain"), "--tree", "2,2,4", "--json",
                                      "--threads", "1"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["best"] is None and doc["rows"][0]["speedup"] is None
    # a cost model that cannot price a shape fails before the drafter is loaded
    result = CliRunner().invoke(cli, ["eval", "sweep", "--drafter", str(tmp_path / "nowhere"), "--store", str(store),
                                      "--tree", "2,2,4", "--cost", str(tmp_path / "nope.json")])
    assert result.exit_code == 2 and "not a file, a preset" in result.output

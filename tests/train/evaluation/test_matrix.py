"""Cross-domain matrix (table, means, heatmap) and the `osprey eval` commands."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.errors import ConfigError
from osprey_train.evaluation.matrix import MatrixResult, parse_labeled, summarize, to_markdown
from tests.train.evaluation.store_util import make_drafter_dir, make_sharp_llama, make_store


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_tokenizer_dir):
    root = tmp_path_factory.mktemp("matrix")
    target = make_sharp_llama(root / "target", tiny_tokenizer_dir, init_range=0.6)
    store = make_store(root / "store", target, num_samples=3, max_new_tokens=8)
    return root, store, make_drafter_dir(root / "d1", seed=1), make_drafter_dir(root / "d2", seed=2)


def test_summary_and_markdown():
    drafters, stores = ["math", "code", "mix"], ["math", "code", "chat"]
    vals = [[3.0, 2.0, 1.0], [1.5, 4.0, 2.5], [2.0, 2.0, 2.0]]
    s = summarize(drafters, stores, vals)
    assert s["math"] == {"in_domain": 3.0, "out_of_domain": 1.5}
    assert s["code"] == {"in_domain": 4.0, "out_of_domain": 2.0}
    assert s["mix"] == {"in_domain": None, "out_of_domain": 2.0}
    md = to_markdown(MatrixResult(drafters, stores, vals, [False, True, False], 5, s))
    assert "| math | **3.00** | 2.00 | 1.00 | 3.00 | 1.50 |" in md
    assert "code*" in md and "proxy" in md


def test_parse_labeled():
    assert parse_labeled(["a=/x/y", "/p/q/"], "--store") == [("a", "/x/y"), ("q", "/p/q/")]
    with pytest.raises(ConfigError, match="duplicate"):
        parse_labeled(["a=/x", "a=/y"], "--store")


def test_eval_cli_acceptance_and_matrix(setup):
    root, store, d1, d2 = setup
    runner = CliRunner()
    res = runner.invoke(cli, ["eval", "acceptance", "--drafter", str(d1), "--store", str(store),
                              "--steps", "3", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["steps"] == 3 and rep["overall"] >= 1.0 and rep["num_samples"] == 3
    out = root / "mx"
    res = runner.invoke(cli, ["eval", "matrix", "--drafter", f"chat={d1}", "--drafter", f"mix={d2}",
                              "--store", f"chat={store}", "--store", f"other={store}", "--steps", "2",
                              "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "matrix.json").read_text())
    assert doc["drafters"] == ["chat", "mix"] and len(doc["values"][0]) == 2
    # same store under two labels: in-domain and out-of-domain figures of "chat" coincide
    assert doc["summary"]["chat"]["in_domain"] == pytest.approx(doc["summary"]["chat"]["out_of_domain"])
    assert doc["summary"]["mix"]["in_domain"] is None
    assert (out / "matrix.png").stat().st_size > 1000 and "**" in (out / "matrix.md").read_text()
    res = runner.invoke(cli, ["eval", "acceptance", "--drafter", str(d1), "--store", str(root / "nope")])
    assert res.exit_code == 2 and "error:" in res.output

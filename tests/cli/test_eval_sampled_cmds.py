"""``--temperature`` on ``osprey eval acceptance``, ``sweep`` and ``matrix`` through the CLI on tiny stores."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.schema_check import validate


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tiny_llama_dir):
    from tests.helpers.tiny_store import make_tiny_store
    from tests.train.evaluation.store_util import make_drafter_dir, make_prompts, make_store

    root = tmp_path_factory.mktemp("sampled_cli")
    greedy = make_store(root / "greedy", tiny_llama_dir, num_samples=3, max_new_tokens=8)
    sampled = make_tiny_store(root / "t1", tiny_llama_dir, prompts=make_prompts(4), max_new_tokens=8, topk=8,
                              layers=(2, 3, 4), temperature=1.0, seed=3)
    return make_drafter_dir(root / "drafter", seed=1, store=greedy), greedy, sampled


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_acceptance_at_the_store_temperature(stores):
    drafter, _, sampled = stores
    res = invoke("eval", "acceptance", "--drafter", drafter, "--store", sampled, "--steps", 3, "--temperature", 1.0,
                 "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    sm = doc["sampled"]
    assert doc["proxy"] is False and sm["temperature"] == 1.0 and doc["num_samples"] == 4
    assert sm["ci95"][0] <= doc["overall"] <= sm["ci95"][1]
    assert sm["tail_bounds"][0] <= doc["overall"] <= sm["tail_bounds"][1]
    assert 1.0 <= doc["overall"] <= 4.0 and len(doc["per_position"]) == 3 == len(sm["per_position_ci95"])
    assert set(sm["per_domain"]) == set(doc["per_domain"])
    text = invoke("eval", "acceptance", "--drafter", drafter, "--store", sampled, "--steps", 3,
                  "--temperature", 1.0).output
    assert "speculative sampling at temperature 1" in text and "95% CI" in text and "NOTE" not in text


def test_temperature_mismatch_is_refused_unless_allowed(stores):
    drafter, greedy, sampled = stores
    res = invoke("eval", "acceptance", "--drafter", drafter, "--store", greedy, "--temperature", 0.7)
    assert res.exit_code == 2
    # (the thread policy's "machine busy" note may precede it on a loaded machine)
    lines = [line for line in res.output.splitlines() if line.strip() and not line.startswith("machine busy")]
    assert len(lines) == 1 and "sampled greedily" in lines[0] and "--allow-temperature-mismatch" in lines[0]
    res = invoke("eval", "acceptance", "--drafter", drafter, "--store", sampled, "--temperature", 0.7)
    assert res.exit_code == 2 and "at temperature 1, not at the serving temperature 0.7" in res.output
    res = invoke("eval", "acceptance", "--drafter", drafter, "--store", greedy, "--temperature", 0.7,
                 "--allow-temperature-mismatch", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["proxy"] and "greedily" in doc["proxy_reason"]


def test_greedy_report_is_unchanged_by_the_new_options(stores):
    drafter, greedy, _ = stores
    base = invoke("eval", "acceptance", "--drafter", drafter, "--store", greedy, "--json")
    zero = invoke("eval", "acceptance", "--drafter", drafter, "--store", greedy, "--json", "--temperature", 0)
    assert base.exit_code == 0 and base.stdout == zero.stdout and "sampled" not in json.loads(base.stdout)


def test_trees_are_refused_at_a_temperature(stores, tmp_path):
    drafter, _, sampled = stores
    res = invoke("eval", "acceptance", "--drafter", drafter, "--store", sampled, "--tree", "2,2,4",
                 "--temperature", 1.0)
    assert res.exit_code == 2 and "chain rejection sampling only" in res.output
    res = invoke("eval", "sweep", "--drafter", drafter, "--store", sampled, "--out", tmp_path / "s",
                 "--temperature", 1.0)
    assert res.exit_code == 2 and "sweep chains only" in res.output


def test_sweep_and_matrix_at_a_temperature(stores, tmp_path):
    drafter, _, sampled = stores
    res = invoke("eval", "sweep", "--drafter", drafter, "--store", sampled, "--out", tmp_path / "s",
                 "--grid-steps", "1,3", "--grid-topk", "1", "--temperature", 1.0, "--threads", 1,
                 "--cost", "draft_step=0.1,verify_scale=0.02")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "s" / "sweep.json").read_text())
    validate(doc, "tree-sweep.v1.json", where="sweep.json")
    assert doc["temperature"] == 1.0 and [r["steps"] for r in doc["rows"]] == [1, 3]
    single = json.loads(invoke("eval", "acceptance", "--drafter", drafter, "--store", sampled, "--steps", 3,
                               "--temperature", 1.0, "--json").stdout)
    assert doc["rows"][1]["acceptance_length"] == pytest.approx(single["overall"], rel=1e-12)
    res = invoke("eval", "matrix", "--drafter", f"chat={drafter}", "--store", f"chat={sampled}", "--out",
                 tmp_path / "m", "--steps", 3, "--temperature", 1.0)
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "m" / "matrix.json").read_text())
    assert m["temperature"] == 1.0 and m["values"][0][0] == pytest.approx(single["overall"], rel=1e-12)
    assert "speculative sampling at T=1" in res.output


def test_the_profile_of_a_sampled_store_has_both_greedy_and_its_temperature(stores, tmp_path):
    """Issue 33: --profile measures greedy acceptance and, on a store sampled at T, the expected
    acceptance at T; a greedy run with --tree refuses it."""
    drafter, _, sampled = stores
    profile = tmp_path / "speculation_profile.json"
    res = invoke("eval", "acceptance", "--drafter", drafter, "--store", sampled, "--steps", 3, "--profile", profile,
                 "--json")
    assert res.exit_code == 0, res.output
    greedy, doc = json.loads(res.stdout), json.loads(profile.read_text())
    validate(doc, "speculation-profile.v1.json", where=str(profile))
    assert doc["mean_accept_length"] == pytest.approx(greedy["overall"], abs=1e-6)
    at_t = json.loads(invoke("eval", "acceptance", "--drafter", drafter, "--store", sampled, "--steps", 3,
                             "--temperature", 1.0, "--json").stdout)
    assert doc["osprey"]["sampled"]["temperature"] == 1.0
    assert doc["osprey"]["sampled"]["mean_accept_length"] == pytest.approx(at_t["overall"], abs=1e-6)
    assert doc["osprey"]["store"]["generation"]["temperature"] == 1.0
    res = invoke("eval", "acceptance", "--drafter", drafter, "--store", sampled, "--tree", "3,1,4",
                 "--profile", tmp_path / "t.json")
    assert res.exit_code == 2 and "--profile describes chain drafting" in res.output

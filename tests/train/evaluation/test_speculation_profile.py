"""``osprey eval acceptance --profile``: speculation_profile.json (Model-Optimizer's fields) agrees with
the acceptance report, names the store and the weights it was measured on, and travels with an
export only while it describes the exported weights (issue 33)."""

from __future__ import annotations

import json

import pytest
import torch

from osprey_data.errors import ConfigError, SchemaError
from osprey_data.store import StoreReader
from osprey_train.evaluation.acceptance import run as acceptance
from osprey_train.evaluation.options import AcceptanceConfig
from osprey_train.evaluation.speculation_profile import PROFILE_FILE
from osprey_train.export import ExportConfig
from osprey_train.export import run as export_run
from osprey_train.models import load_drafter, save_drafter
from tests.train.evaluation.store_util import make_drafter_dir, make_sharp_llama, make_store, quick_distill

STEPS = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_tokenizer_dir):
    root = tmp_path_factory.mktemp("profile")
    target = make_sharp_llama(root / "target", tiny_tokenizer_dir, init_range=0.6)
    store = make_store(root / "store", target, num_samples=4, max_new_tokens=14)
    drafter = quick_distill(load_drafter(make_drafter_dir(root / "drafter", seed=3)), StoreReader(str(store)),
                            steps=10, lr=1e-2)
    save_drafter(drafter, root / "trained")
    return root, store, root / "trained"


def test_the_profile_is_the_reports_figures_in_model_optimizers_fields(setup):
    root, store, drafter = setup
    report = acceptance(AcceptanceConfig(drafter=drafter, store=str(store), steps=STEPS, progress=False,
                                         profile=drafter / PROFILE_FILE))
    doc = json.loads((drafter / PROFILE_FILE).read_text())
    hist = {int(k): v for k, v in doc["acceptance_length_histogram"].items()}
    assert sum(hist.values()) == report.num_verify_steps and sum(k * v for k, v in hist.items()) == report.num_tokens
    assert doc["mean_accept_length"] == pytest.approx(report.overall, abs=1e-6)
    # the identity serving tools rely on: mean = 1 + sum of the marginals, and conditionals are their ratios
    assert 1 + sum(doc["marginal_accept_rates"]) == pytest.approx(doc["mean_accept_length"], abs=1e-5)
    assert doc["validation"]["mean_consistency"]["passed"] and doc["validation"]["marginal_monotonicity"]["passed"]
    m, c = doc["marginal_accept_rates"], doc["conditional_accept_rates"]
    assert len(m) == len(c) == STEPS and c[0] == pytest.approx(m[0], abs=1e-6)
    assert 0 < m[0] < 1, "the drafter must accept some drafts and reject some for the check to bite"
    assert doc["num_speculative_tokens"] == STEPS and doc["accept_length_model"] == "chain_analytic"
    assert doc["osprey"]["store"]["digest"] == StoreReader(str(store)).manifest.digest()
    assert doc["osprey"]["target"]["config_hash"] == StoreReader(str(store)).header.target.config_hash
    assert doc["osprey"]["per_position_judged"] == pytest.approx(report.per_position, abs=1e-6)
    assert doc["osprey"]["sampled"] is None                       # a greedy store: no temperature to estimate at
    assert set(doc["per_category"]) == set(report.per_domain)
    with pytest.raises(ConfigError, match="--profile .*does not exist"):
        AcceptanceConfig(drafter=drafter, store=str(store), profile=root / "nowhere" / PROFILE_FILE)


def test_export_carries_the_profile_only_with_the_weights_it_measured(setup, tmp_path):
    root, store, drafter = setup
    acceptance(AcceptanceConfig(drafter=drafter, store=str(store), steps=STEPS, progress=False,
                                profile=drafter / PROFILE_FILE))
    out = export_run(ExportConfig(drafter=drafter, format="hf", out=tmp_path / "hf")).out
    assert (out / PROFILE_FILE).read_bytes() == (drafter / PROFILE_FILE).read_bytes()
    # train further (other weights) and the old profile is refused, naming how to measure again
    moved = tmp_path / "moved"
    model = load_drafter(drafter)
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).add_(0.01)
    save_drafter(model, moved)
    (moved / PROFILE_FILE).write_bytes((drafter / PROFILE_FILE).read_bytes())
    with pytest.raises(ConfigError, match="measured on other weights.*--profile"):
        export_run(ExportConfig(drafter=moved, format="hf", out=tmp_path / "hf2"))
    assert not (tmp_path / "hf2").exists()
    (moved / PROFILE_FILE).write_text('{"schema_version": "2.0"}')
    with pytest.raises(SchemaError, match=PROFILE_FILE):
        export_run(ExportConfig(drafter=moved, format="hf", out=tmp_path / "hf3"))

"""Issue #45 items 4-5: `osprey eval acceptance` on a store with no samples (or none with a verify
round) refuses instead of printing 0.000 over 0 samples; a temperature below the stated floor is
refused with a message, and the tempered target stays finite at low temperatures (it was 0 / 0,
ending in `AssertionError: nan`)."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.errors import ConfigError
from osprey_data.store import StoreReader
from osprey_train.evaluation.acceptance import MIN_TEMPERATURE, evaluate_acceptance
from osprey_train.evaluation.sampled_target import tempered_target
from osprey_train.models.io import load_drafter
from tests.helpers.tiny_store import make_tiny_store
from tests.train.evaluation.store_util import make_drafter_dir, make_store


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_llama_dir):
    root = tmp_path_factory.mktemp("faults45")
    store = make_store(root / "store", tiny_llama_dir, num_samples=2, max_new_tokens=8)
    empty = make_tiny_store(root / "empty", tiny_llama_dir, prompts=[], max_new_tokens=8, layers=(2, 3, 4))
    short = make_store(root / "short", tiny_llama_dir, num_samples=2, max_new_tokens=1)
    drafter = make_drafter_dir(root / "drafter", store=store)
    return {"store": store, "empty": empty, "short": short, "drafter": drafter}


@pytest.mark.parametrize("extra", [[], ["--temperature", "0.7", "--allow-temperature-mismatch"]])
def test_a_store_without_samples_is_refused(setup, extra):
    assert len(StoreReader(str(setup["empty"]))) == 0
    res = CliRunner().invoke(cli, ["eval", "acceptance", "--drafter", str(setup["drafter"]), "--store",
                                   str(setup["empty"]), "--steps", "2", *extra])
    assert res.exit_code == 2, res.output
    assert "holds 0 samples, so there is no acceptance length to measure" in res.output
    assert "0.000" not in res.output and "inf" not in res.output


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_store_without_a_verify_round_is_refused(setup, temperature):
    drafter, reader = load_drafter(setup["drafter"]), StoreReader(str(setup["short"]))
    with pytest.raises(ConfigError, match="none of the 2 samples .* has a verify round"):
        evaluate_acceptance(drafter, reader, steps=2, progress=False, temperature=temperature,
                            allow_temperature_mismatch=True)


@pytest.mark.parametrize("temperature", ["1e-30", "1e-6", "5e-5"])
def test_a_temperature_below_the_floor_is_refused_not_an_assertion(setup, temperature):
    res = CliRunner().invoke(cli, ["eval", "acceptance", "--drafter", str(setup["drafter"]), "--store",
                                   str(setup["store"]), "--steps", "2", "--temperature", temperature])
    assert res.exit_code == 2, res.output
    assert f"below {MIN_TEMPERATURE:g} speculative sampling is greedy" in res.output
    assert "--temperature 0" in res.output and "AssertionError" not in res.output


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-3, 0.01])
def test_low_temperatures_at_and_above_the_floor_give_a_finite_figure(setup, temperature):
    drafter, reader = load_drafter(setup["drafter"]), StoreReader(str(setup["store"]))
    report = evaluate_acceptance(drafter, reader, steps=2, progress=False, temperature=temperature,
                                 allow_temperature_mismatch=True)
    lo, hi = report.sampled["ci95"]
    assert 1.0 <= report.overall <= 3.0 and lo == lo and hi == hi   # no nan


def test_the_tempered_target_of_flat_rows_stays_finite_at_a_low_temperature():
    # log p1 about -12 on every stored entry: p1^(1/T) underflows to 0 for T = 0.01 (0 / 0 before)
    lp = torch.log_softmax(torch.randn(4, 5000, dtype=torch.float64) * 0.1, -1)
    top = lp.topk(8, -1)
    for temperature in (0.01, 1e-3):
        tt = tempered_target(top.values, temperature, 5000)
        exact = torch.softmax(lp / temperature, -1).gather(1, top.indices)
        assert torch.isfinite(tt.p_lo_NK).all() and torch.isfinite(tt.p_hi_NK).all()
        assert (tt.p_lo_NK <= exact + 1e-12).all() and (exact <= tt.p_hi_NK + 1e-12).all()
        assert torch.isfinite(tt.tail_hi_N).all()

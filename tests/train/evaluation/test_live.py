"""``osprey eval live`` end to end on a tiny fp32 target: report, losslessness, and agreement
with offline acceptance (``osprey eval acceptance``) on a store built from the same prompts."""

from __future__ import annotations

import json

import pytest
import torch

from osprey_data.errors import ConfigError, InputError, ModelError
from osprey_data.cpu_threads import busy_machine_threads
from osprey_train.evaluation.live import LiveConfig, run
from osprey_train.evaluation.live_prompts import load_prompts
from osprey_train.evaluation.live_report import summarize
from tests.helpers.tiny_store import TINY_PROMPTS
from tests.train.evaluation.store_util import make_live_setup

MAX_NEW = 16
STEPS = 3


@pytest.fixture(scope="module")
def live_setup(tmp_path_factory, tiny_llama_dir):
    """A store from TINY_PROMPTS, and an Osprey drafter pruned from the target and converted."""
    return make_live_setup(tmp_path_factory.mktemp("live"), tiny_llama_dir, max_new_tokens=MAX_NEW)


def _config(setup, **kw):
    base = dict(drafter=str(setup["drafter"]), target=str(setup["target"]), inputs=(str(setup["prompts"]),),
                steps=STEPS, max_new_tokens=MAX_NEW, device="cpu", progress=False)
    return LiveConfig(**{**base, **kw})


def test_live_greedy_report_is_lossless_and_complete(live_setup, tmp_path):
    out = tmp_path / "live.json"
    report = run(_config(live_setup, out=str(out)))
    assert report.num_prompts == len(TINY_PROMPTS)
    assert report.greedy_identical == report.num_prompts  # lossless on every prompt
    assert set(report.per_domain) == {r["domain"] for r in TINY_PROMPTS}
    assert report.spec_tokens == report.plain_tokens
    assert 1.0 <= report.acceptance_length <= STEPS + 1
    assert report.spec_tokens_per_s > 0 and report.plain_tokens_per_s > 0
    doc = json.loads(out.read_text())
    assert doc["acceptance_length"] == pytest.approx(report.acceptance_length)
    assert "| **all** |" in report.to_markdown()


def test_offline_acceptance_equals_live_greedy(live_setup):
    """The offline walk over the store and real speculative decoding give the same numbers."""
    from osprey_data.store import StoreReader
    from osprey_train.evaluation.acceptance import evaluate_acceptance
    from osprey_train.models import load_drafter

    # the plain store: it holds exactly the ids the target generated (stop token included)
    reader = StoreReader(str(live_setup["store"]))
    offline = evaluate_acceptance(load_drafter(live_setup["drafter"]), reader, steps=STEPS, progress=False)
    # the store keeps taps as bf16; the store's target ran in float32
    live = run(_config(live_setup, tap_codec="bf16", baseline=False, precision="float32"))
    by_id = {s["id"]: s for s in live.samples}
    assert offline.num_samples == live.num_prompts
    assert offline.num_tokens == live.verify_tokens == live.spec_tokens - live.num_prompts
    assert offline.num_verify_steps == live.verify_steps == sum(s["verify_steps"] for s in live.samples)
    assert offline.per_position == pytest.approx(live.per_position, abs=1e-12)
    assert offline.overall == pytest.approx(live.acceptance_length, abs=1e-12)
    for domain, value in offline.per_domain.items():
        assert value == pytest.approx(live.per_domain[domain]["acceptance_length"], abs=1e-12)
    assert len(by_id) == len(TINY_PROMPTS)
    # not vacuous: the pruned+converted drafter gets some drafts accepted
    assert live.acceptance_length > 1.0 and 0 < live.per_position[0] < 1
    # a greedy store passes the integrity check: stored top-1 = next stored token everywhere
    assert offline.greedy_consistency == 1.0 and not offline.proxy


@pytest.mark.parametrize("precision", ["bfloat16", "bf16-autocast"])
def test_live_in_bf16_is_lossless_and_records_its_precision(live_setup, precision):
    """Greedy speculative decoding equals plain greedy decoding in the same precision."""
    from osprey_data.target_model import precision as prec

    if precision == "bfloat16" and not {"amx_bf16", "avx512_bf16"} & prec._cpu_flags():
        pytest.skip("prepacked bf16 linears need a CPU with bf16 matrix instructions")
    report = run(_config(live_setup, precision=precision, limit=3))
    assert report.precision == {"target": precision, "drafter": precision}
    assert report.greedy_identical == report.num_prompts
    assert f"precision target={precision}" in report.to_markdown()


def test_live_precision_auto_follows_the_cpu(live_setup, monkeypatch):
    from osprey_data.target_model import precision as prec

    monkeypatch.delenv(prec.CAPABILITY_ENV, raising=False)
    monkeypatch.setattr(prec, "_cpu_flags", lambda: frozenset({"avx2"}))
    report = run(_config(live_setup, limit=1, baseline=False))
    assert report.precision == {"target": "float32", "drafter": "float32"}
    with pytest.raises(ConfigError, match="--precision"):
        _config(live_setup, precision="int8")
    with pytest.raises(ConfigError, match="bf16-autocast"):
        run(_config(live_setup, precision="float32", draft_precision="bf16-autocast", limit=1))


def test_limit_is_round_robin_over_domains(live_setup, tiny_tokenizer):
    prompts = load_prompts((str(live_setup["prompts"]),), tiny_tokenizer, limit=5)
    assert len(prompts) == 5
    assert len({p.domain for p in prompts}) == 5


def test_bad_inputs_raise_clear_errors(live_setup, tmp_path, tiny_tokenizer):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "plain text"}\n', encoding="utf-8")
    with pytest.raises(InputError, match="bad.jsonl:1"):
        load_prompts((str(bad),), tiny_tokenizer)
    with pytest.raises(ConfigError, match="--steps"):
        _config(live_setup, steps=0)
    with pytest.raises(ConfigError, match="drafter folder"):
        _config(live_setup, drafter=str(tmp_path / "nope"))


def test_drafter_for_another_target_is_refused(live_setup, tiny_qwen3_dir):
    with pytest.raises(ModelError, match="another"):
        run(_config(live_setup, target=str(tiny_qwen3_dir), limit=1))


def test_summarize_pools_verify_steps():
    samples = [
        {"id": "a", "domain": "x", "tokens": 7, "verify_steps": 2, "accept_lengths": [4, 2], "accepted": [3, 1], "drafted": [3, 3], "seconds": 1.0,
         "plain_seconds": 2.0, "plain_tokens": 7, "identical": True},
        {"id": "b", "domain": "y", "tokens": 4, "verify_steps": 3, "accept_lengths": [1, 1, 1], "accepted": [0, 0, 0], "drafted": [3, 3, 1], "seconds": 1.0,
         "plain_seconds": 1.0, "plain_tokens": 4, "identical": True},
    ]
    report = summarize(samples, steps=3, temperature=0.0, baseline=True)
    # accept lengths sum to 6 + 3 (the prefill's tokens are in "tokens" but in no verify round)
    assert report.acceptance_length == pytest.approx(9 / 5)
    assert report.verify_tokens == 9 and report.verify_steps == 5
    assert report.per_domain["x"]["acceptance_length"] == 3.0
    assert report.speedup == pytest.approx((11 / 2) / (11 / 3))
    assert report.greedy_identical == 2
    # position 0 judged 5 times (accepted twice); position 1 twice (once); position 2 once (once)
    assert report.per_position == pytest.approx([2 / 5, 1 / 2, 1 / 1])


def test_busy_machine_uses_one_thread(monkeypatch):
    import os

    notes = []
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    assert busy_machine_threads(notes.append) == 1 and "busy" in notes[0]
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert busy_machine_threads(notes.append) is None


def test_run_restores_the_thread_count(live_setup):
    before = torch.get_num_threads()
    run(_config(live_setup, limit=1, max_new_tokens=2, baseline=False, threads=before + 1))
    assert torch.get_num_threads() == before


# --- --steps auto (issue 46) -----------------------------------------------------------------


def test_steps_auto_is_the_default_and_measures_its_costs(live_setup):
    config = LiveConfig(drafter=str(live_setup["drafter"]), target=str(live_setup["target"]),
                        inputs=(str(live_setup["prompts"]),), max_new_tokens=MAX_NEW, device="cpu", progress=False,
                        limit=3, max_steps=3)
    assert config.steps == "auto" and config.auto_steps and config.most_steps == 3
    report = run(config)
    assert report.greedy_identical == report.num_prompts   # lossless whatever S each round took
    auto = report.draft_length
    assert auto["max_steps"] == 3 and "measured at the start" in auto["cost"]["source"]
    assert sorted(auto["cost"]["verify"]) == ["1", "2", "3", "4"]
    rounds = [d for s in report.samples for d in s["drafted"]]
    assert sum(auto["rounds_by_steps"].values()) == len(rounds) == report.verify_steps
    assert all(0 <= d <= 3 for d in rounds)
    md = report.to_markdown()
    assert "S=auto (0..3)" in md and "Draft length: auto (S = 0..3" in md


@pytest.mark.parametrize("cost, plain_rounds", [("draft_step=5,verify_scale=0", True),
                                                ("draft_step=0.01,verify_scale=0", False)])
def test_steps_auto_follows_the_costs(live_setup, cost, plain_rounds):
    """Drafts 5x dearer than a target step never pay: plain steps (S = 0) but for the first round
    and rare probes; drafts that cost nothing are always worth a try (S > 0). Lossless either way."""
    report = run(_config(live_setup, steps="auto", max_steps=3, cost=cost, limit=3))
    assert report.greedy_identical == report.num_prompts
    rounds = report.draft_length["rounds_by_steps"]
    total = sum(rounds.values())
    if plain_rounds:
        assert rounds.get(0, 0) >= 0.8 * total
    else:   # only a last round with one token of budget left drafts nothing (a draft could not be emitted)
        assert all(0 not in s["drafted"][:-1] for s in report.samples) and rounds.get(0, 0) <= report.num_prompts
    assert "costs --cost " + cost in report.to_markdown()


def test_a_fixed_steps_run_is_unchanged(live_setup):
    report = run(_config(live_setup, limit=2))
    assert report.draft_length is None and report.steps == STEPS
    md = report.to_markdown()
    assert f"S={STEPS}," in md and "Draft length" not in md
    for s in report.samples:
        room = [MAX_NEW - 1 - sum(s["accept_lengths"][:i]) for i in range(len(s["drafted"]))]
        assert s["drafted"] == [min(STEPS, r) for r in room]


def test_steps_options_are_checked(live_setup):
    with pytest.raises(ConfigError, match="--steps must be 'auto' or a positive integer"):
        _config(live_setup, steps="fast")
    with pytest.raises(ConfigError, match="--max-steps"):
        _config(live_setup, steps="auto", max_steps=0)
    with pytest.raises(ConfigError, match="--cost is for --steps auto"):
        _config(live_setup, cost="example-gpu")
    with pytest.raises(ConfigError, match="--cost"):
        _config(live_setup, steps="auto", cost="/nonexistent/cost.json")


def test_a_slowdown_says_so_next_to_the_figure():
    """Issue 48: ``speedup x0.56`` alone reads as a gain."""
    from osprey_train.evaluation.live_report import speedup_text

    assert speedup_text(0.56) == "speedup x0.56 (slower than plain decoding)"
    assert speedup_text(1.31) == "speedup x1.31"
    samples = [{"id": "a", "domain": "x", "tokens": 4, "verify_steps": 3, "accept_lengths": [1, 1, 1],
                "accepted": [0, 0, 0], "drafted": [3, 3, 1], "seconds": 2.0, "plain_seconds": 1.0, "plain_tokens": 4,
                "identical": True}]
    md = summarize(samples, steps=3, temperature=0.0, baseline=True).to_markdown()
    assert "speedup x0.50 (slower than plain decoding)" in md

"""The engine-vs-ours reconciliation (pure Python): the end-of-request overcount rule, and what breaks it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from osprey_data.errors import BackendUnavailableError
from osprey_train.engines.compare import counts_from_rounds, first_difference, reconcile
from osprey_train.engines.rig import find_rig

# a response of 1 (prefill) + 7 tokens, S = 3: rounds accept 3, 0, then 2 of the 2 tokens left
WALK = [(3, 4, 3), (0, 1, 3), (2, 2, 2)]


def _engine(per_pos, drafts=3):
    return {"num_drafts": drafts, "accepted_per_pos": per_pos, "num_draft_tokens": 3 * drafts,
            "num_accepted_tokens": sum(per_pos)}


def test_counts_per_position_and_first_difference():
    assert counts_from_rounds([3, 0, 2], 3) == [2, 2, 1]
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_equal_counts_agree():
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_engine([2, 2, 1]), walk=WALK)
    assert row.agrees and row.overcount == 0 and row.engine_reconciled == [2, 2, 1] and row.offline_emitted == 7


def test_a_draft_accepted_past_the_end_is_the_overcount():
    # vLLM also accepted draft 3 of the last round (it matched the target's token past max_tokens)
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_engine([2, 2, 2]), walk=WALK)
    assert row.agrees, row.why
    assert row.overcount == 1 and row.overcount_per_pos == [0, 0, 1] and row.engine_reconciled == [2, 2, 1]


def test_extra_accepted_drafts_anywhere_else_disagree():
    # one more accepted than ours, but the last round did not accept everything up to the end
    walk = [(3, 4, 3), (0, 1, 3), (1, 2, 2)]
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_engine([2, 2, 1]), walk=walk)
    assert not row.agrees and "not at the end" in row.why
    # same total, other positions (a drafter that is wrong at one position, right at another)
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_engine([3, 1, 1]), walk=WALK)
    assert not row.agrees and "per position" in row.why
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_engine([1, 1, 1]), walk=WALK)
    assert not row.agrees and "fewer" in row.why
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_engine([2, 2, 1], drafts=4), walk=WALK)
    assert not row.agrees and "rounds" in row.why


def test_live_counts_ride_along():
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_engine([2, 2, 1]), walk=WALK,
                    live_accepted=[3, 0, 2], identical={"spec_vs_plain": True})
    assert row.live_per_pos == [2, 2, 1] and row.live_rounds == 3 and row.to_dict()["engine_reconciled"] == [2, 2, 1]


def test_missing_engine_venv_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("OSPREY_VLLM_VENV", raising=False)
    with pytest.raises(BackendUnavailableError, match="engines/setup_vllm.sh"):
        find_rig("vllm", tmp_path / "nope")
    from osprey_cli.main import cli

    (tmp_path / "drafter").mkdir()
    (tmp_path / "p.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    res = CliRunner().invoke(cli, ["eval", "engine", "--drafter", str(tmp_path / "drafter"), "--target", str(tmp_path),
                                   "--input", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o"), "--venv",
                                   str(tmp_path / "nope")])
    assert res.exit_code == 2 and "vllm engine venv" in res.output and "setup_vllm.sh" in res.output


def _per_round(rounds, per_pos=None):
    per_pos = per_pos or counts_from_rounds(rounds, 3)
    return {**_engine(per_pos, drafts=len(rounds)), "accepted_per_round": rounds}


def test_round_by_round_counts_agree_with_the_overcount_in_the_last_round_only():
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_per_round([3, 0, 2]), walk=WALK)
    assert row.agrees and row.first_round_differing is None and row.offline_per_round == [3, 0, 2]
    # the last round counted a draft past the request's end: allowed there
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=_per_round([3, 0, 3]), walk=WALK)
    assert row.agrees, row.why
    assert row.overcount == 1 and row.engine_per_round == [3, 0, 3]


def test_rounds_that_swap_their_counts_agree_per_position_but_not_round_by_round():
    # two rounds of 3 and 0 accepted give the same per-position counts in either order
    walk = [(3, 4, 3), (0, 1, 3), (1, 2, 3)]
    swapped = _per_round([0, 3, 1])
    assert counts_from_rounds([0, 3, 1], 3) == counts_from_rounds([3, 0, 1], 3)
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=swapped, walk=walk)
    assert not row.agrees and row.first_round_differing == 1
    assert "round 1 of 3 differs first: the engine accepted 0, ours 3" in row.why
    # without per-round counts the same engine figures pass: what the round-by-round check adds
    per_pos_only = {k: v for k, v in swapped.items() if k != "accepted_per_round"}
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=per_pos_only, walk=walk)
    assert row.agrees and row.engine_per_round is None


def test_per_round_counts_that_do_not_add_up_are_reported():
    engine = {**_engine([2, 2, 1]), "accepted_per_round": [3, 0]}   # one round missing from the read
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8, engine=engine, walk=WALK)
    assert not row.agrees and "do not add up" in row.why and row.first_round_differing == 3


def test_the_export_summary_counts_prompts_compared_round_by_round():
    from osprey_train.engines.engine_report import summarize_export

    same = {"spec_vs_plain": True}
    rows = [reconcile(sample_id=i, domain="d", steps=3, tokens=8, engine=engine, walk=WALK, identical=same)
            for i, engine in (("a", _per_round([3, 0, 2])), ("b", _per_round([0, 3, 2])), ("c", _engine([2, 2, 1])))]
    summary = summarize_export("x", rows, {})
    assert (summary.per_round_prompts, summary.per_round_agreeing, summary.prompts_agreeing) == (2, 1, 2)
    assert not summary.agrees and summary.prompts[1]["first_round_differing"] == 1

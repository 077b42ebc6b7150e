"""``--steps auto``: the draft length chosen per round from step costs and the running acceptance.

The policy alone (torch-free), then the loop with stub drafters on a tiny target: S = 0 for a
drafter that never agrees, S > 0 for an oracle, output identical to plain decoding either way, the
drafter still fed every committed position's taps exactly once, and a fixed S unchanged."""

from __future__ import annotations

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_train.evaluation.cost_model import CostModel, parse_cost
from osprey_train.evaluation.draft_length import (
    DraftLengthPolicy,
    PositionAcceptance,
    expected_tokens,
    measure_costs,
    parse_steps,
)
from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate, speculative_generate
from tests.train.evaluation._live_stubs import hashed_drafter, oracle_drafter

PROMPT = [5, 17, 42, 99, 3, 250, 7]
# CPU-like costs of a small target: a 4-token verify costs 1.3 plain steps, a draft step 0.1
COST = CostModel(device="test", draft_step=0.1, verify_scale=0.1, round_overhead=0.05, assumed=True, source="test")


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def test_expected_tokens_and_the_estimate():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 2) == pytest.approx(1.75)
    est = PositionAcceptance(max_steps=3)
    assert est.rates() == [0.5, 0.5, 0.5]   # the prior
    est.observe(drafted=3, accepted=1)      # draft 1 accepted, draft 2 rejected, draft 3 never judged
    assert est.rates()[0] > 0.5 > est.rates()[1]
    assert est.rates()[2] == est.rates()[1]   # never judged: expected to do what position 2 does


def test_policy_stops_drafting_for_a_drafter_that_never_agrees_and_probes_rarely():
    policy = DraftLengthPolicy(cost=COST, max_steps=4)
    assert policy.choose(room=100) > 0   # the prior says drafting might pay
    chosen = []
    for _ in range(400):
        s = policy.choose(room=100)
        policy.observe(s, 0)
        chosen.append(s)
    assert chosen[-300:].count(0) >= 295   # a handful of probes in 300 rounds
    assert policy.probes >= 2              # but it does keep looking
    assert policy.to_dict()["rounds_by_steps"][0] == policy.used[0]


def test_policy_drafts_long_for_an_oracle_and_never_past_the_budget():
    policy = DraftLengthPolicy(cost=COST, max_steps=4)
    for _ in range(20):
        s = policy.choose(room=100)
        policy.observe(s, s)
    assert policy.choose(room=100) == 4
    assert policy.choose(room=3) == 2   # the round's own token is the third
    assert policy.choose(room=1) == 0   # one token left: a draft could never be emitted


def test_a_cost_table_that_misses_a_block_size_fails_at_once():
    cost = CostModel(device="t", draft_step=0.1, verify={1: 1.0, 4: 1.2})
    with pytest.raises(ConfigError, match="no verify cost for 5"):
        DraftLengthPolicy(cost=cost, max_steps=5)


def test_parse_steps():
    assert parse_steps("auto") == "auto" and parse_steps(" AUTO ") == "auto"
    assert parse_steps("3") == 3 and parse_steps(2) == 2
    for bad in ("0", "-1", "x", "2.5"):
        with pytest.raises(ConfigError, match="auto"):
            parse_steps(bad)


def _reference(model, n):
    return plain_generate(HFTargetSession(model), PROMPT, max_new_tokens=n).output_ids


def test_auto_picks_plain_steps_for_a_drafter_that_never_agrees(tiny_llama):
    n = 40
    reference = _reference(tiny_llama, n)
    drafter = hashed_drafter(tiny_llama.config.vocab_size, seed=5)   # random drafts over 384 ids
    policy = DraftLengthPolicy(cost=COST, max_steps=4)
    out = speculative_generate(HFTargetSession(tiny_llama, (1, 3)), drafter, PROMPT, num_steps=4,
                               max_new_tokens=n, policy=policy)
    assert out.output_ids == reference
    assert out.drafted.count(0) >= len(out.drafted) - 6   # a few rounds to learn, a probe or two
    assert out.drafted[0] > 0 and policy.used[0] == out.drafted.count(0)
    assert sum(out.accept_lengths) == n - 1


def test_auto_drafts_for_an_oracle(tiny_llama):
    n = 40
    reference = _reference(tiny_llama, n)
    drafter = oracle_drafter(reference, len(PROMPT), tiny_llama.config.vocab_size)
    policy = DraftLengthPolicy(cost=COST, max_steps=4)
    out = speculative_generate(HFTargetSession(tiny_llama, (1, 3)), drafter, PROMPT, num_steps=4,
                               max_new_tokens=n, policy=policy)
    assert out.output_ids == reference
    # from the prior it lengthens the chain as the drafts keep being accepted, up to the maximum
    # (the last round has one token of budget left: no draft could be emitted, so it drafts none)
    assert 0 < out.drafted[0] < 4 and all(d == 4 for d in out.drafted[2:-1]) and out.drafted[-1] in (0, 4)
    assert out.accepted == out.drafted


def test_plain_rounds_keep_the_drafter_in_step(tiny_llama):
    """Rounds of S = 0 do not call the drafter; its next call gets the taps of every position
    committed since its last one, so it sees each committed position's taps exactly once."""
    taps = (0, 2, 5)
    drafter = hashed_drafter(tiny_llama.config.vocab_size, seed=2)
    policy = DraftLengthPolicy(cost=COST, max_steps=3, probe_after=3, probe_max=3)
    out = speculative_generate(HFTargetSession(tiny_llama, taps), drafter, PROMPT, num_steps=3, max_new_tokens=30,
                               policy=policy)
    assert out.drafted.count(0) > 3 and drafter.calls < len(out.drafted)   # plain rounds happened
    ids = PROMPT + out.output_ids
    received = torch.cat(drafter.received_taps)
    with torch.no_grad():
        hs = tiny_llama(torch.tensor([ids]), output_hidden_states=True).hidden_states
    full = torch.stack([hs[i][0] for i in taps], dim=1)
    assert received.shape[0] == drafter.last_ids_len - 1
    assert torch.allclose(received, full[: received.shape[0]], atol=1e-5)


def test_a_fixed_steps_run_drafts_that_many_every_round(tiny_llama):
    drafter = hashed_drafter(tiny_llama.config.vocab_size, seed=3)
    out = speculative_generate(HFTargetSession(tiny_llama, (1,)), drafter, PROMPT, num_steps=3, max_new_tokens=20)
    room = [20 - 1 - sum(out.accept_lengths[:i]) for i in range(len(out.accept_lengths))]
    assert out.drafted == [min(3, r) for r in room]
    assert drafter.calls == len(out.drafted)


def test_measured_costs_come_from_this_target_and_drafter(tiny_llama):
    target = HFTargetSession(tiny_llama, (1, 3))
    drafter = hashed_drafter(tiny_llama.config.vocab_size, seed=1)
    cost = measure_costs(target, drafter, PROMPT, 3, repeats=3)
    assert sorted(cost.verify) == [1, 2, 3, 4] and all(v > 0 for v in cost.verify.values())
    assert cost.draft_step >= 0 and cost.round_overhead >= 0 and cost.plain_step_seconds > 0
    assert "measured" in cost.source
    DraftLengthPolicy(cost=cost, max_steps=3)   # covers every block the policy can choose
    assert parse_cost("draft_step=0.1,verify_scale=0.1").assumed


# the quick demo's measured float32 costs (issue 46): drafting one token pays above p1 ~ 0.08
DEMO_COST = CostModel(device="test", draft_step=0.041, verify={1: 1.0, 2: 1.02, 3: 1.01, 4: 1.62, 5: 1.6},
                      round_overhead=0.0165, source="test")


def _run_weak_drafter(optimism: float, rounds: int = 600) -> DraftLengthPolicy:
    """A drafter whose first draft is accepted one round in 8 (0.125, above break-even), whose first
    8 drafted rounds were all rejected (bad luck) and whose later drafts are never accepted."""
    policy = DraftLengthPolicy(cost=DEMO_COST, max_steps=4, optimism=optimism)
    drafted_rounds = 0
    for _ in range(rounds):
        s = policy.choose(room=100)
        if s:
            drafted_rounds += 1
            policy.observe(s, int(drafted_rounds > 8 and drafted_rounds % 8 == 0))
    return policy


def test_early_rejections_do_not_stop_a_drafter_above_break_even():
    """Issue 46: the quick demo's drafter (p1 ~0.12) was stopped after a few unlucky rounds and decoded
    plainly from then on (x0.99); the optimistic estimate keeps it drafting while the evidence is thin."""
    stuck, kept = _run_weak_drafter(0.0), _run_weak_drafter(1.0)
    assert stuck.used[0] > 500                 # without optimism: plain decoding from round ~10 on
    assert kept.used[0] < 200 and kept.explored > 0
    assert 0.09 < kept.acceptance.rates()[0] < 0.16
    with pytest.raises(ConfigError, match="optimism"):
        DraftLengthPolicy(cost=DEMO_COST, max_steps=2, optimism=-1)


def test_the_optimistic_estimate_drops_a_drafter_that_never_agrees():
    policy = DraftLengthPolicy(cost=DEMO_COST, max_steps=4)
    chosen = []
    for _ in range(400):
        s = policy.choose(room=100)
        policy.observe(s, 0)
        chosen.append(s)
    assert sum(1 for s in chosen if s) <= 30 and chosen[-300:].count(0) >= 295
    est = PositionAcceptance(max_steps=2)
    assert est.rates(1.0)[0] > est.rates()[0] == 0.5

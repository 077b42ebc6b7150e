"""Offline acceptance vs a direct step-by-step greedy speculative decode with the same drafter."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from osprey_data.store import StoreReader
from osprey_train.evaluation.acceptance import acceptance_walk, evaluate_acceptance, proxy_reason
from osprey_train.evaluation.chain_draft import ChainDraftState, draft_all_positions, previous_conditions
from osprey_train.models import CausalAttention, load_drafter
from tests.train.evaluation.store_util import make_drafter_dir, make_sharp_llama, make_store, quick_distill



@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory, tiny_tokenizer_dir):
    root = tmp_path_factory.mktemp("acc")
    target = make_sharp_llama(root / "target", tiny_tokenizer_dir, init_range=0.6)
    reader = StoreReader(str(make_store(root / "store", target, num_samples=4, max_new_tokens=14)))
    # Briefly distilled, so that some drafts are accepted and some rejected: the comparison bites.
    drafter = quick_distill(load_drafter(make_drafter_dir(root / "drafter", seed=3)), reader,
                            steps=10, lr=1e-2)
    return reader, drafter


def _direct_chain(drafter, ids, conds, p, steps):
    """Re-run the drafter causally on [x_0..x_p, d_1..d_k] with conds [c_-1..c_{p-1}, h^0..h^{k-1}]."""
    seq, cond = list(ids[: p + 1]), [conds[j] for j in range(p + 1)]
    out = []
    for _ in range(steps):
        h = drafter.forward_hidden(torch.tensor([seq]), torch.stack(cond)[None],
                                   torch.arange(len(seq))[None], CausalAttention())[0, -1]
        d = int(drafter.logits(h[None]).argmax(-1))
        out.append(d)
        seq.append(d)
        cond.append(h)
    return out


@torch.no_grad()
def _direct_decode(drafter, sample, steps):
    """Greedy chain speculative decoding against the stored (greedy) response, step by step."""
    ids = sample.token_ids.tolist()
    conds = previous_conditions(drafter, sample.hidden_TLD.float())
    T, p = len(ids), sample.prompt_length - 1
    tokens = vsteps = 0
    while p < T - 1:
        drafts = _direct_chain(drafter, ids, conds, p, steps)
        a = 0
        while a < min(steps, T - 1 - p) and drafts[a] == ids[p + 1 + a]:
            a += 1
        y = min(a + 1, T - 1 - p)
        tokens, vsteps, p = tokens + y, vsteps + 1, p + y
    return tokens, vsteps


@pytest.mark.parametrize("steps", [3])
def test_offline_equals_direct_decode(tiny_setup, steps):
    reader, drafter = tiny_setup
    report = evaluate_acceptance(drafter, reader, steps=steps, progress=False)
    tok, vs = defaultdict(int), defaultdict(int)
    for i in range(len(reader)):
        s = reader.sample(i, as_torch=True)
        t, v = _direct_decode(drafter, s, steps)
        tok[s.domain] += t
        vs[s.domain] += v
    assert report.num_tokens == sum(tok.values())
    assert report.num_verify_steps == sum(vs.values())
    assert report.overall == pytest.approx(sum(tok.values()) / sum(vs.values()))
    assert report.per_domain == pytest.approx({d: tok[d] / vs[d] for d in tok})
    assert not report.proxy and len(report.per_position) == steps
    assert 1.3 < report.overall < 3.5  # non-trivial: drafts both accepted and rejected
    assert report.greedy_consistency > 0.99


def test_all_positions_drafts_equal_incremental_state(tiny_setup):
    reader, drafter = tiny_setup
    s = reader.sample(1, as_torch=True)
    taps = s.hidden_TLD.float()
    drafts = draft_all_positions(drafter, s.token_ids, taps, 4)
    conds = previous_conditions(drafter, taps)
    state = ChainDraftState(drafter)
    T = s.token_ids.shape[0]
    for p in range(T):
        state.commit(s.token_ids[p:p + 1], conds[p:p + 1])
        assert state.propose(4) == drafts[p].tolist(), p
    assert drafts[T - 2].tolist() == _direct_chain(drafter, s.token_ids.tolist(), conds, T - 2, 4)


def test_walk_rules():
    # prompt of 2 tokens; response 5 tokens: positions 2..6; drafts row p proposes p+1.. .
    ids = [9, 9, 1, 2, 3, 4, 5]
    drafts = {p: [ids[p + 1] if p + 1 < len(ids) else 0, 0, 0] for p in range(len(ids))}
    drafts[1] = [1, 2, 7]          # at p=1: accepts 2, yields 3 -> p=4
    drafts[4] = [4, 5, 8]          # at p=4: remaining 2, accepts both, yields 2 (no bonus past end)
    walk = acceptance_walk(ids, 2, [drafts[p] for p in range(len(ids))])
    assert walk == [(2, 3, 3), (2, 2, 2)]


def test_proxy_flag():
    class H:
        generation = {"temperature": 0.7, "greedy": False}

    assert "sampled" in proxy_reason(H())
    H.generation = {"regenerate": False}
    assert "not generated" in proxy_reason(H())
    H.generation = {"temperature": 0.0}
    assert proxy_reason(H()) is None


def test_eagle3_drafts_are_target_ids(tmp_path, tiny_setup):
    reader, _ = tiny_setup
    d2t = torch.arange(128) * 3
    drafter = load_drafter(make_drafter_dir(tmp_path / "e3", preset="tiny-eagle3", draft_vocab=d2t))
    s = reader.sample(0, as_torch=True)
    drafts = draft_all_positions(drafter, s.token_ids, s.hidden_TLD.float(), 2)
    assert bool((drafts % 3 == 0).all())
    report = evaluate_acceptance(drafter, reader, steps=2, progress=False, max_samples=2)
    assert report.num_samples == 2 and report.overall >= 1.0

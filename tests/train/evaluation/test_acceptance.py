"""Offline acceptance vs a direct step-by-step greedy speculative decode with the same drafter,
and the batched drafts vs the incremental (live) drafter."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from osprey_data.store import StoreReader
from osprey_train.evaluation.acceptance import acceptance_walk, evaluate_acceptance, per_position_rates, proxy_reason
from osprey_train.evaluation.chain_draft import draft_all_positions
from osprey_train.evaluation.live_drafter import DrafterSession
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


def _direct_chain(drafter, ids, taps, p, steps):
    """With x_0..x_p committed: re-run the drafter causally on slots (x_1, c_0) .. (x_p, c_{p-1}) at
    positions 0..p-1, then on each draft with the previous hidden state as its condition."""
    seq = list(ids[1: p + 1])
    cond = list(drafter.fuse_taps(taps[None, :p])[0])
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
    """Greedy chain speculative decoding against the stored (greedy) response, step by step; the
    first response token comes from the prefill and opens no verify round (SGLang)."""
    ids = sample.token_ids.tolist()
    taps = sample.hidden_TLD.float()
    T, p = len(ids), sample.prompt_length
    tokens = vsteps = 0
    while p < T - 1:
        drafts = _direct_chain(drafter, ids, taps, p, steps)
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
    responses = [len(reader.sample(i).token_ids) - reader.sample(i).prompt_length for i in range(len(reader))]
    assert report.num_tokens == sum(responses) - len(responses)  # all but each prefill's token
    assert report.overall == pytest.approx(sum(tok.values()) / sum(vs.values()))
    assert report.per_domain == pytest.approx({d: tok[d] / vs[d] for d in tok})
    assert not report.proxy and len(report.per_position) == steps
    assert 0.1 < report.per_position[0] < 0.9  # non-trivial: first drafts both accepted and rejected
    assert 1.1 < report.overall < 3.5
    assert report.greedy_consistency > 0.99


@pytest.mark.parametrize("arch", ["osprey", "osprey-dv", "eagle3", "eagle3-2l"])
def test_all_positions_drafts_equal_the_incremental_drafter(tiny_setup, tmp_path, arch):
    """draft_all_positions (TTT attention, every round at once) == DrafterSession (KV cache +
    rollback, what live decoding runs), committing one token at a time."""
    reader, drafter = tiny_setup
    if arch.startswith("eagle3"):
        drafter = load_drafter(make_drafter_dir(tmp_path / "e3", preset="tiny-eagle3", seed=4,
                                                draft_vocab=torch.arange(128) * 3,
                                                num_layers=2 if arch == "eagle3-2l" else 1))
    elif arch == "osprey-dv":  # reduced draft vocabulary: drafts are mapped target ids
        drafter = load_drafter(make_drafter_dir(tmp_path / "dv", preset="tiny", seed=4,
                                                draft_vocab=torch.arange(128) * 3))
    s = reader.sample(1, as_torch=True)
    taps = s.hidden_TLD.float()
    T = s.token_ids.shape[0]
    drafts = draft_all_positions(drafter, s.token_ids, taps, 4)
    assert drafts.shape == (T - 1, 4)
    session = DrafterSession(drafter)
    ids = s.token_ids.tolist()
    for p in range(1, T):  # x_0..x_p committed: the drafter gets the taps of position p - 1
        proposal, _ = session.propose(ids[: p + 1], taps[p - 1: p], 4, 0.0, None)
        assert proposal == drafts[p - 1].tolist(), p
    if arch == "osprey":
        assert drafts[T - 2].tolist() == _direct_chain(drafter, ids, taps, T - 1, 4)


def test_walk_rules():
    # prompt of 2 tokens; response 5 tokens at positions 2..6, the first (x_2) from the prefill.
    # drafts are slot-indexed: row q is proposed with x_0..x_{q+1} committed.
    ids = [9, 9, 1, 2, 3, 4, 5]
    drafts = [[0, 0, 0] for _ in range(len(ids) - 1)]
    drafts[1] = [2, 3, 7]          # x_0..x_2 committed: accepts 2, yields 3 -> x_5 committed
    drafts[4] = [5, 8, 8]          # one token left: compares one draft, yields it (no bonus past the end)
    walk = acceptance_walk(ids, 2, drafts)
    assert walk == [(2, 3, 3), (1, 1, 1)]
    assert sum(y for _, y, _ in walk) == len(ids) - 2 - 1
    assert acceptance_walk(ids[:3], 2, drafts[:2]) == []  # only the prefill's token: no round


def test_per_position_rates():
    # (accepted, compared): position 0 judged 3 times (2 hits), 1 twice (1 hit), 2 once (0 hits)
    assert per_position_rates([(2, 3), (0, 3), (1, 3)], 3) == pytest.approx([2 / 3, 1 / 2, 0.0])
    assert per_position_rates([(1, 1)], 3) == [1.0, 0.0, 0.0]  # capped by the drafts compared


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
    assert drafts.shape == (s.token_ids.shape[0] - 1, 2) and bool((drafts % 3 == 0).all())
    report = evaluate_acceptance(drafter, reader, steps=2, progress=False, max_samples=2)
    assert report.num_samples == 2 and report.overall >= 1.0

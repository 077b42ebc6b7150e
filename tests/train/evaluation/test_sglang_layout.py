"""Our offline chain drafts and acceptance figures against SGLang's EAGLE worker, written out here.

The reference below re-derives, from SGLang's documented draft-extend + decode semantics (topk = 1
chain, greedy verification), what the engine feeds a drafter, without calling any of our drafting
or evaluation code (only the drafter network itself: ``fuse_taps``, ``forward_hidden`` with plain
causal attention over the explicit input lists, ``logits``):

* prefill: the target runs the prompt ``x_0..x_{r-1}``, giving hidden states ``h_0..h_{r-1}`` and
  the first response token ``x_r`` (the "verified id"); no draft involved;
* draft extend (``prepare_for_extend``): the drafter consumes the left-shifted ids
  ``[x_1..x_{r-1}, x_r]`` paired with ``h_0..h_{r-1}`` at positions ``0..r-1``;
* draft decode: ``d_1`` is the argmax at the last extended position (mapped to a target id through
  the hot-token map); each further ``d_i`` comes from feeding ``d_{i-1}`` with the previous
  step's hidden state at position ``seq_len + i - 2`` (the first decode position is the number of
  extended positions);
* verify: the target scores ``[x_p, d_1..d_S]``; the longest prefix equal to its greedy tokens is
  accepted and one target token follows; ``accept_length`` per round = accepted + 1, cut at the
  end of the response;
* draft extend after decode: the emitted tokens paired with the target's hidden states of the
  verify positions that produced them (``h_p..``), at positions ``p..``;
* ``spec_accept_length`` = (accepted + 1 summed over rounds) / rounds.

The target is the store: its responses are the target's greedy tokens and its taps are the
target's hidden states (the builder writes both verbatim).
"""

from __future__ import annotations

import pytest
import torch

from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.evaluation.chain_draft import draft_all_positions
from osprey_train.models import CausalAttention
from tests.train.evaluation.store_util import make_layout_setup

STEPS = 3


class SGLangChainWorker:
    """The drafter side of SGLang's EAGLE worker for one request, topk = 1, from its semantics."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.ids: list[int] = []         # extended input ids (the drafter's KV cache entries)
        self.hidden: list[torch.Tensor] = []  # their conditions: fc / W_c of the target hidden states
        self.positions: list[int] = []

    def draft_extend(self, input_ids, target_hidden_TLDt, start_position):
        fused = self.drafter.fuse_taps(target_hidden_TLDt[None].float())[0]
        self.ids += list(input_ids)
        self.hidden += list(fused)
        self.positions += list(range(start_position, start_position + len(input_ids)))

    def _last_hidden(self, ids, conds, positions):
        h = self.drafter.forward_hidden(torch.tensor([ids]), torch.stack(conds)[None], torch.tensor([positions]),
                                        CausalAttention())
        return h[0, -1]

    def _to_target(self, draft_id):
        hot = self.drafter.draft_to_target
        return draft_id if hot is None else int(hot[draft_id])

    def draft(self, steps):
        ids, conds, positions = list(self.ids), list(self.hidden), list(self.positions)
        seq_len = len(self.ids)
        h = self._last_hidden(ids, conds, positions)
        drafts = []
        for i in range(1, steps + 1):
            drafts.append(self._to_target(int(self.drafter.logits(h[None]).argmax(-1))))
            if i == steps:
                break
            ids.append(drafts[-1])      # decode step i: the previous draft ...
            conds.append(h)             # ... with the drafter's own previous hidden state ...
            positions.append(seq_len + i - 1)  # ... at seq_len, seq_len + 1, ...
            h = self._last_hidden(ids, conds, positions)
        return drafts                   # the decode entries are not kept (no extend for them)


@torch.no_grad()
def sglang_serve(drafter, token_ids, taps_TLDt, prompt_length, steps):
    """Rounds of one request: ``[(committed p, drafts, accepted, accept_length)]``."""
    ids = [int(t) for t in token_ids]
    T, r = len(ids), prompt_length
    worker = SGLangChainWorker(drafter)
    worker.draft_extend(ids[1:r] + [ids[r]], taps_TLDt[:r], 0)  # prefill -> x_r verified
    p, rounds = r, []
    while p < T - 1:
        drafts = worker.draft(steps)
        left = T - 1 - p
        accepted = 0
        while accepted < min(steps, left) and drafts[accepted] == ids[p + 1 + accepted]:
            accepted += 1
        emitted = min(accepted + 1, left)
        rounds.append((p, drafts, accepted, emitted))
        worker.draft_extend(ids[p + 1: p + 1 + emitted], taps_TLDt[p: p + emitted], p)
        p += emitted
    return rounds


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_tokenizer_dir):
    return make_layout_setup(tmp_path_factory.mktemp("sglang_layout"), tiny_tokenizer_dir)


@pytest.mark.parametrize("arch", ["osprey-distilled", "osprey-random", "eagle3-random"])
def test_offline_drafts_and_acceptance_equal_sglang_semantics(setup, arch):
    reader, drafters = setup
    drafter = drafters[arch]
    rounds_all, compared = [], 0
    for i in range(len(reader)):
        s = reader.sample(i, as_torch=True)
        taps = s.hidden_TLD.float()
        ours = draft_all_positions(drafter, s.token_ids, taps, STEPS)
        rounds = sglang_serve(drafter, s.token_ids, taps, s.prompt_length, STEPS)
        assert rounds and rounds[0][0] == s.prompt_length  # the first round follows the prefill's token
        for p, drafts, _, _ in rounds:
            assert ours[p - 1].tolist() == drafts, (i, p)
            compared += 1
        rounds_all += rounds
    assert compared >= 20
    report = evaluate_acceptance(drafter, reader, steps=STEPS, progress=False)
    assert report.num_verify_steps == len(rounds_all)
    assert report.num_tokens == sum(e for *_, e in rounds_all)
    assert report.overall == pytest.approx(sum(e for *_, e in rounds_all) / len(rounds_all), abs=1e-12)
    if arch == "osprey-distilled":  # not vacuous: drafts were accepted and rejected
        assert 0 < sum(a for _, _, a, _ in rounds_all) < len(rounds_all) * STEPS
    else:  # not vacuous: drafts depend on their inputs
        assert len({d for _, drafts, _, _ in rounds_all for d in drafts}) >= 20

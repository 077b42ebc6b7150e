"""The live harness with real drafters (Osprey and EAGLE-3): KV-cached drafting vs a naive
recompute, and greedy losslessness end to end."""

from __future__ import annotations

import pytest
import torch

from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.evaluation.live_drafter import DrafterSession
from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate, speculative_generate
from osprey_train.models import CausalAttention, DrafterConfig

TAPS = (2, 3, 4)
PROMPT = [5, 17, 42, 99, 3, 250, 7, 11]


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def _random_drafter(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    if arch == "osprey":
        model = OspreyDrafter(DrafterConfig.from_name("tiny"))
    elif arch == "osprey-dv":  # reduced draft vocabulary (convert --draft-vocab)
        model = OspreyDrafter(DrafterConfig.from_name("tiny", draft_vocab_size=128))
        model.set_draft_vocab(torch.arange(1, 384, 3)[:128])
    else:  # "eagle3", or "eagle3-2l": the multi-layer control (midlayer + a plain layer)
        model = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", num_layers=2 if arch == "eagle3-2l" else 1))
        model.set_draft_vocab(torch.arange(0, 384, 3)[:128])
    with torch.no_grad():  # non-zero everywhere, so the taps really matter (convert zero-inits some)
        for p in model.parameters():
            if p.dtype.is_floating_point:
                p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


class RecordingSession(DrafterSession):
    """Records every proposal with the ids it was made for."""

    def reset(self) -> None:
        super().reset()
        self.log = getattr(self, "log", [])

    def propose(self, ids, new_taps_TLDt, num_steps, temperature, generator):
        drafts, probs = super().propose(ids, new_taps_TLDt, num_steps, temperature, generator)
        self.log.append((list(ids), drafts))
        return drafts, probs


def _naive_drafts(drafter, taps_TLDt, ids, steps):
    """Recompute the whole chain from scratch with causal attention in the engine layout: slot q gets
    (x_{q+1}, fuse(taps_q)) at position q; draft k is fed with the drafter's previous hidden state."""
    tokens = list(ids[1:])
    cond = drafter.fuse_taps(taps_TLDt[None, : len(ids) - 1])
    drafts = []
    with torch.no_grad():
        for _ in range(steps):
            positions = torch.arange(len(tokens))[None]
            hidden = drafter.forward_hidden(torch.tensor([tokens]), cond, positions, CausalAttention())
            draft_id = int(drafter.logits(hidden[:, -1:])[0, -1].argmax())
            d2t = drafter.draft_to_target
            token = draft_id if d2t is None else int(d2t[draft_id])
            drafts.append(token)
            tokens.append(token)
            cond = torch.cat([cond, hidden[:, -1:]], dim=1)
    return drafts


@pytest.mark.parametrize("arch", ["osprey", "osprey-dv", "eagle3", "eagle3-2l"])
def test_cached_drafting_equals_naive_recompute_and_is_lossless(tiny_llama, arch):
    drafter = _random_drafter(arch)
    session = RecordingSession(drafter, target_vocab_size=tiny_llama.config.vocab_size)
    n, steps = 20, 4
    out = speculative_generate(HFTargetSession(tiny_llama, TAPS), session, PROMPT, num_steps=steps,
                               max_new_tokens=n)
    reference = plain_generate(HFTargetSession(tiny_llama), PROMPT, max_new_tokens=n)
    assert out.output_ids == reference.output_ids

    full = PROMPT + out.output_ids
    with torch.no_grad():
        hs = tiny_llama(torch.tensor([full]), output_hidden_states=True).hidden_states
    taps_TLDt = torch.stack([hs[i][0] for i in TAPS], dim=1)
    assert len(session.log) >= 4
    for ids, drafts in session.log:
        assert drafts == _naive_drafts(drafter, taps_TLDt, ids, len(drafts))
    if drafter.draft_to_target is not None:  # every draft is a target id from the draft vocabulary
        allowed = set(drafter.draft_to_target.tolist())
        assert all(d in allowed for _, ds in session.log for d in ds)


@pytest.mark.parametrize("arch", ["osprey-dv", "eagle3"])
def test_sampling_with_a_real_drafter_runs_and_respects_budget(tiny_llama, arch):
    drafter = _random_drafter(arch, seed=2)
    session = DrafterSession(drafter, target_vocab_size=tiny_llama.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    out = speculative_generate(HFTargetSession(tiny_llama, TAPS), session, PROMPT, num_steps=3,
                               max_new_tokens=9, temperature=0.8, generator=g)
    assert len(out.output_ids) == 9 and sum(out.accept_lengths) == 8

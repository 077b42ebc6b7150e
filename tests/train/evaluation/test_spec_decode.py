"""Exact tests of the speculative-decoding loop with stub drafters (fixed logits)."""

from __future__ import annotations

import pytest
import torch

from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate, speculative_generate
from osprey_train.evaluation.verify import residual_distribution, verify_greedy, verify_sampling
from tests.train.evaluation._live_stubs import (
    LogitsFnDrafter,
    chi2_critical,
    chi2_stat,
    hashed_drafter,
    make_small_vocab_llama,
    oracle_drafter,
)


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


PROMPT = [5, 17, 42, 99, 3, 250, 7]


# --- single verify step ---------------------------------------------------------------------


def test_verify_greedy_matches_naive_reference():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        steps = int(torch.randint(0, 5, (1,), generator=g))
        logits = torch.randn(steps + 1, 4, generator=g)
        best = logits.argmax(-1).tolist()
        # drafts agree with the argmax on a random prefix, then disagree (or not)
        drafts = [b if torch.rand((), generator=g) < 0.7 else (b + 1) % 4 for b in best[:steps]]
        naive = 0
        for d, b in zip(drafts, best):
            if d != b:
                break
            naive += 1
        assert verify_greedy(drafts, logits) == (naive, best[naive])


def test_residual_distribution_is_normalized_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.6, 0.2, 0.1])
    assert torch.allclose(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(residual_distribution(p, p), p)


def _first_token_counts(rule, p_SV, q_SV, trials, seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p_SV.shape[-1])
    steps = q_SV.shape[0]
    for _ in range(trials):
        drafts = []
        for i in range(steps):
            drafts.append(int(torch.multinomial(q_SV[i], 1, generator=g)))
        accepted, nxt = rule(drafts, q_SV, p_SV, g)
        first = drafts[0] if accepted > 0 else nxt
        counts[first] += 1
    return counts


def test_verify_sampling_emits_the_target_distribution():
    p_SV = torch.softmax(torch.tensor([[2.0, 0.5, -1.0, 0.0, 1.0]] * 3), -1)
    q_SV = torch.softmax(torch.tensor([[-1.0, 2.0, 1.0, 0.5, 0.0]] * 2), -1)
    counts = _first_token_counts(verify_sampling, p_SV, q_SV, 6000, seed=1)
    stat, df = chi2_stat(counts, p_SV[0])
    assert stat < chi2_critical(df), (counts / counts.sum(), p_SV[0])

    # power check: a broken rule that always accepts emits q, and the same test rejects it
    def accept_all(drafts, q, p, g):
        return len(drafts), int(torch.multinomial(p[-1], 1, generator=g))

    counts = _first_token_counts(accept_all, p_SV, q_SV, 6000, seed=1)
    stat, df = chi2_stat(counts, p_SV[0])
    assert stat > chi2_critical(df)


def test_verify_sampling_identical_distributions_accept_everything():
    p_SV = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(3)), -1)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        drafts = [int(torch.multinomial(p_SV[i], 1, generator=g)) for i in range(3)]
        accepted, _ = verify_sampling(drafts, p_SV[:3], p_SV, g)
        assert accepted == 3


# --- the whole loop on a tiny HF target -----------------------------------------------------


def _plain(model, prompt, n, **kw):
    return plain_generate(HFTargetSession(model), prompt, max_new_tokens=n, **kw)


@pytest.mark.parametrize("steps", [1, 3, 6])
@pytest.mark.parametrize("kind", ["oracle", "hashed", "noisy"])
def test_greedy_speculative_decoding_is_lossless(tiny_llama, steps, kind):
    n = 24
    vocab = tiny_llama.config.vocab_size
    reference = _plain(tiny_llama, PROMPT, n).output_ids
    hf = tiny_llama.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert reference == hf
    if kind == "oracle":
        drafter = oracle_drafter(reference, len(PROMPT), vocab)
    elif kind == "hashed":
        drafter = hashed_drafter(vocab, seed=steps)
    else:  # right about half of the time
        wrong = hashed_drafter(vocab, seed=11)
        drafter = LogitsFnDrafter(lambda ctx: oracle_drafter(reference, len(PROMPT), vocab).logits_fn(ctx)
                                  if (len(ctx) * 7919) % 3 else wrong.logits_fn(ctx))
    target = HFTargetSession(tiny_llama, tap_layers=(1, 3, 4))
    out = speculative_generate(target, drafter, PROMPT, num_steps=steps, max_new_tokens=n)
    assert out.output_ids == reference
    assert sum(out.accept_lengths) == n - 1  # the first token comes from the prefill (SGLang)
    assert all(1 <= a <= steps + 1 for a in out.accept_lengths)
    # no EOS here: every round adds the target's own token, but the budget may cut the last one
    assert [a - 1 for a in out.accept_lengths[:-1]] == out.accepted[:-1]
    assert out.accept_lengths[-1] - out.accepted[-1] in (0, 1)
    assert all(0 <= a <= d <= steps for a, d in zip(out.accepted, out.drafted))
    if kind == "oracle":
        full, rest = divmod(n - 1, steps + 1)
        assert out.accept_lengths == [steps + 1] * full + ([rest] if rest else [])
        assert out.accepted == out.drafted
    if kind == "hashed":  # random drafts over 384 ids are essentially never right
        assert len(out.accept_lengths) >= n - 3


def test_eos_stops_generation_in_both_loops(tiny_llama):
    vocab = tiny_llama.config.vocab_size
    reference = _plain(tiny_llama, PROMPT, 12).output_ids
    eos = reference[5]  # pretend the 6th greedy token is EOS
    cut = reference[: reference.index(eos) + 1]
    plain = _plain(tiny_llama, PROMPT, 12, eos_ids=[eos])
    assert plain.output_ids == cut and plain.finish_reason == "stop"
    spec = speculative_generate(HFTargetSession(tiny_llama, (1,)), oracle_drafter(reference, len(PROMPT), vocab),
                                PROMPT, num_steps=4, max_new_tokens=12, eos_ids=[eos])
    assert spec.output_ids == cut and spec.finish_reason == "stop"


def test_drafter_receives_exactly_the_committed_taps(tiny_llama):
    taps = (0, 2, 5)
    drafter = hashed_drafter(tiny_llama.config.vocab_size, seed=2)
    out = speculative_generate(HFTargetSession(tiny_llama, taps), drafter, PROMPT, num_steps=3, max_new_tokens=10)
    ids = PROMPT + out.output_ids
    received = torch.cat(drafter.received_taps)
    with torch.no_grad():
        hs = tiny_llama(torch.tensor([ids]), output_hidden_states=True).hidden_states
    full = torch.stack([hs[i][0] for i in taps], dim=1)
    # call k receives the taps of positions up to len(ids_k) - 2, each position exactly once
    assert received.shape[0] == drafter.last_ids_len - 1
    assert torch.allclose(received, full[: received.shape[0]], atol=1e-5)


def test_sampling_loop_preserves_the_target_distribution():
    """Tokens 2 and 3 come out of one verify round with two sampled drafts (token 1 from the
    prefill, token 4 the round's own): their joint distribution must be the target's."""
    vocab, prompt, trials = 3, [1, 2, 0], 900
    model = make_small_vocab_llama(vocab, seed=0, logit_scale=3.0)
    target = HFTargetSession(model, tap_layers=(1,))
    drafter = hashed_drafter(vocab, seed=5, scale=1.5)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab * vocab)
    for _ in range(trials):
        out = speculative_generate(target, drafter, prompt, num_steps=2, max_new_tokens=4, temperature=1.0,
                                   generator=g)
        assert out.drafted[0] == 2
        counts[out.output_ids[1] * vocab + out.output_ids[2]] += 1

    def probs(ctx):
        return torch.softmax(model(torch.tensor([ctx])).logits[0, -1], -1)

    # exact joint distribution of tokens 2 and 3 under the target alone (token 1 marginalized)
    with torch.no_grad():
        p1 = probs(prompt)
        joint = torch.zeros(vocab * vocab)
        for a in range(vocab):
            p2 = probs(prompt + [a])
            for b in range(vocab):
                joint[b * vocab: (b + 1) * vocab] += p1[a] * p2[b] * probs(prompt + [a, b])
    stat, df = chi2_stat(counts, joint)
    assert stat < chi2_critical(df), (counts / trials, joint)
    # the drafter's own distribution differs, so this is not vacuous
    with torch.no_grad():
        q2 = torch.softmax(drafter.logits_fn(prompt + [0]) / 1.0, -1)
        assert (q2 - probs(prompt + [0])).abs().max() > 0.1


def test_sliding_window_target_rolls_back_correctly():
    """Gemma-3-style sliding-window layers drop old states unless told to keep them: rejected
    drafts past the window must still roll back exactly."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                           max_position_embeddings=128,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    model = Gemma3ForCausalLM(cfg).eval()
    prompt = [3, 5, 7, 9, 11, 13, 2, 4]
    reference = _plain(model, prompt, 20).output_ids
    hf = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, len(prompt):].tolist()
    assert reference == hf
    oracle, wrong = oracle_drafter(reference, len(prompt), 64), hashed_drafter(64, seed=1)
    drafter = LogitsFnDrafter(lambda c: oracle.logits_fn(c) if len(c) % 3 else wrong.logits_fn(c))
    out = speculative_generate(HFTargetSession(model, (1, 2)), drafter, prompt, num_steps=4, max_new_tokens=20)
    assert out.output_ids == reference
    assert any(a < 5 for a in out.accept_lengths[:-1]) and max(out.accept_lengths) > 1  # both paths taken

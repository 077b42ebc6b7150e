"""Contract every builder backend must satisfy, checked against naive HF references.

Subclass :class:`BackendContract` and provide a ``backend`` fixture (and optionally tolerances):
the HF backend runs it on CPU with tiny models; the SGLang backend on CUDA where installed.

Legend: T tokens, L taps, D hidden, K top-k, V vocab.
"""

from __future__ import annotations

import numpy as np
import torch

from osprey_data.builder.backends import GenerationRequest, SamplingParams

PROMPTS = [
    "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nThe capital of France is Paris. The capital of Italy is<|im_end|>\n<|im_start|>assistant\n",
]


def reference_model(backend):
    """An independent float32 HF copy of the backend's target."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(backend.identity.name_or_path, dtype=torch.float32).eval()


def naive_greedy(model, prompt_ids, stop_ids, max_new_tokens):
    """Greedy decoding by full recomputation, no cache, no padding: the obvious reference."""
    ids = list(prompt_ids)
    out = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            if nxt in stop_ids:
                return out, "stop", nxt
            out.append(nxt)
            ids.append(nxt)
    return out, "length", None


def assert_same_greedy_ids_up_to_near_ties(backend, other, prompts, *, tie_gap, max_new_tokens=12):
    """``backend`` and ``other`` (another backend at the same precision) decode ``prompts`` (token id
    lists) greedily to the same ids, stop and finish reason; where they split, the float32
    reference must see a near-tie (log-prob gap < ``tie_gap``) between the two tokens."""
    ref = reference_model(backend)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    got = backend.generate([GenerationRequest(tuple(p), seed=0) for p in prompts], params)
    want = other.generate([GenerationRequest(tuple(p), seed=0) for p in prompts], params)
    for p, g, w in zip(prompts, got, want, strict=True):
        a, b = g.generated_ids, w.generated_ids
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), None)
        if k is None:
            assert a == b and (g.finish_reason, g.stop_token_id) == (w.finish_reason, w.stop_token_id)
            continue
        with torch.no_grad():
            lp_V = torch.log_softmax(ref(input_ids=torch.tensor([p + a[:k]])).logits[0, -1].float(), dim=-1)
        gap = float(lp_V[a[k]] - lp_V[b[k]])
        assert abs(gap) < tie_gap, f"greedy ids split at step {k} where the logits are no near-tie ({gap:.3g})"


class BackendContract:
    """Shared tests; ``backend`` is a loaded TargetBackend."""

    hidden_atol = 1e-4
    logprob_atol = 1e-4

    def _encode(self, backend, text):
        return backend.tokenizer(text, add_special_tokens=False)["input_ids"]

    def test_identity(self, backend):
        ident = backend.identity
        assert ident.num_layers >= 2 and ident.hidden_size > 0 and ident.vocab_size >= len(backend.tokenizer)
        assert backend.tokenizer.eos_token_id in backend.stop_ids

    def test_features_match_output_hidden_states(self, backend):
        ref = reference_model(backend)
        L = backend.num_layers
        taps = (1, L // 2, L - 1)
        seqs = [np.asarray(self._encode(backend, p), dtype=np.int32) for p in PROMPTS]
        feats = backend.features(seqs, taps=taps, topk=5, final_hidden=True)
        assert len(feats) == len(seqs)
        for seq, f in zip(seqs, feats):
            T = len(seq)
            with torch.no_grad():
                out = ref(input_ids=torch.tensor(seq[None], dtype=torch.long), output_hidden_states=True)
            hidden_TLD = torch.as_tensor(f.hidden_TLD).float()
            assert tuple(hidden_TLD.shape) == (T, len(taps), backend.identity.hidden_size)  # unpadded
            for j, i in enumerate(taps):
                torch.testing.assert_close(hidden_TLD[:, j], out.hidden_states[i][0], atol=self.hidden_atol, rtol=1e-3)
            torch.testing.assert_close(torch.as_tensor(f.final_hidden_TD).float(), out.hidden_states[L][0],
                                       atol=self.hidden_atol, rtol=1e-3)
            logp_TV = torch.log_softmax(out.logits[0].float(), dim=-1)
            ref_lp, ref_ids = logp_TV.topk(5, dim=-1)
            assert f.topk_ids_TK.dtype == np.int32 and f.topk_logprobs_TK.dtype == np.float32
            assert f.topk_ids_TK.shape == (T, 5)
            np.testing.assert_allclose(f.topk_logprobs_TK, ref_lp.numpy(), atol=self.logprob_atol)
            # ids agree wherever the reference has no near-tie
            gap = (ref_lp[:, :-1] - ref_lp[:, 1:]).min(dim=-1).values.numpy() > 10 * self.logprob_atol
            assert (f.topk_ids_TK[gap] == ref_ids.numpy()[gap]).all()
            assert (np.diff(f.topk_logprobs_TK, axis=1) <= 1e-6).all()  # descending
            assert (f.topk_logprobs_TK <= 0).all()

    def test_greedy_generation_matches_naive_decoding(self, backend):
        ref = reference_model(backend)
        prompts = [self._encode(backend, p) for p in PROMPTS]
        got = backend.generate([GenerationRequest(tuple(p), seed=0) for p in prompts],
                               SamplingParams(max_new_tokens=8))
        for p, g in zip(prompts, got):
            want, reason, stop = naive_greedy(ref, p, backend.stop_ids, 8)
            assert (g.token_ids, g.finish_reason, g.stop_token_id) == (want, reason, stop)
            assert g.generated_ids == want + ([stop] if stop is not None else [])

    def test_sampling_is_seeded_per_request(self, backend):
        prompts = [tuple(self._encode(backend, p)) for p in PROMPTS]
        params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95)
        batch = backend.generate([GenerationRequest(p, seed=11 + i) for i, p in enumerate(prompts)], params)
        alone = backend.generate([GenerationRequest(prompts[2], seed=13)], params)
        again = backend.generate([GenerationRequest(p, seed=11 + i) for i, p in enumerate(prompts)], params)
        other = backend.generate([GenerationRequest(prompts[2], seed=99)], params)
        assert [r.token_ids for r in batch] == [r.token_ids for r in again]
        assert alone[0].token_ids == batch[2].token_ids  # independent of the batch it is in
        assert other[0].token_ids != batch[2].token_ids

    def test_length_limit(self, backend):
        got = backend.generate([GenerationRequest(tuple(self._encode(backend, PROMPTS[0])), seed=0)],
                               SamplingParams(max_new_tokens=3))
        assert len(got[0].token_ids) <= 3
        assert got[0].finish_reason == ("length" if len(got[0].token_ids) == 3 else "stop")
        assert (got[0].stop_token_id is None) == (got[0].finish_reason == "length")

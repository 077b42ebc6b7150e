"""HF backend: the shared contract on tiny Llama and Qwen3, plus HF-specific behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from osprey_data.builder.backends import GenerationRequest, HFBackend, SamplingParams
from osprey_data.builder.backends.hf import sample_next
from osprey_data.builder.config import BuildConfig
from osprey_data.errors import ConfigError, ModelError
from tests.data.builder.backend_contract import PROMPTS, BackendContract


def hf_backend(model_dir) -> HFBackend:
    return HFBackend(BuildConfig(target=str(model_dir), inputs=("unused",), out="unused", device="cpu"))


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def backend(request, tiny_llama_dir, tiny_qwen3_dir):
    return hf_backend(tiny_llama_dir if request.param == "llama" else tiny_qwen3_dir)


class TestHFContract(BackendContract):
    pass


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return hf_backend(tiny_llama_dir)


def test_taps_zero_and_last_follow_hf_convention(llama):
    """Tap 0 is the embedding output, tap L the post-norm state, as in output_hidden_states."""
    seq = np.asarray(llama.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"], dtype=np.int32)
    L = llama.num_layers
    f = llama.features([seq], taps=(0, L, 2), topk=2, final_hidden=False)[0]
    with torch.no_grad():
        hs = llama.model(input_ids=torch.tensor(seq[None], dtype=torch.long), output_hidden_states=True).hidden_states
    torch.testing.assert_close(f.hidden_TLD[:, 0], hs[0][0])
    torch.testing.assert_close(f.hidden_TLD[:, 1], hs[L][0])
    torch.testing.assert_close(f.hidden_TLD[:, 2], hs[2][0])
    assert f.final_hidden_TD is None
    with pytest.raises(ConfigError, match="tap ids"):
        llama.features([seq], taps=(L + 1,), topk=2, final_hidden=False)


def test_batched_prefill_equals_single(llama):
    seqs = [np.asarray(llama.tokenizer(p, add_special_tokens=False)["input_ids"], dtype=np.int32) for p in PROMPTS]
    batch = llama.features(seqs, taps=(1, 3), topk=4, final_hidden=True)
    for s, f in zip(seqs, batch):
        one = llama.features([s], taps=(1, 3), topk=4, final_hidden=True)[0]
        torch.testing.assert_close(f.hidden_TLD, one.hidden_TLD, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(f.topk_logprobs_TK, one.topk_logprobs_TK, atol=1e-5)


def test_stop_token_ends_generation(llama):
    prompt = tuple(llama.tokenizer(PROMPTS[1], add_special_tokens=False)["input_ids"])
    free = llama.generate([GenerationRequest(prompt, seed=0)], SamplingParams(max_new_tokens=6))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 6
    # make the first token that did not occur before a stop token: generation must end there
    k = next(k for k in range(1, 6) if free.token_ids[k] not in free.token_ids[:k])
    saved = llama.stop_ids
    try:
        llama.stop_ids = frozenset({free.token_ids[k]})
        got = llama.generate([GenerationRequest(prompt, seed=0)], SamplingParams(max_new_tokens=6))[0]
    finally:
        llama.stop_ids = saved
    assert got.finish_reason == "stop" and got.token_ids == free.token_ids[:k]  # stop token excluded
    assert got.stop_token_id == free.token_ids[k] and got.generated_ids == free.token_ids[:k + 1]
    assert free.stop_token_id is None and free.generated_ids == free.token_ids


def test_greedy_equals_transformers_generate(llama):
    prompt = llama.tokenizer(PROMPTS[2], add_special_tokens=False)["input_ids"]
    ours = llama.generate([GenerationRequest(tuple(prompt), seed=0)], SamplingParams(max_new_tokens=10))[0]
    with torch.no_grad():
        ref = llama.model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                                   eos_token_id=sorted(llama.stop_ids), pad_token_id=llama.pad_id)
    ref_new = [t for t in ref[0, len(prompt):].tolist() if t not in llama.stop_ids]
    assert ours.token_ids == ref_new[: len(ours.token_ids)]


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.75)
    draws = set()
    gens = [torch.Generator().manual_seed(s) for s in range(1)]
    for _ in range(300):
        draws.add(int(sample_next(logits, params, gens)[0]))
    assert draws == {0, 1}  # 0.5 + 0.3 >= 0.75: tokens 2 and 3 are never drawn
    assert int(sample_next(logits, SamplingParams(max_new_tokens=1), None)[0]) == 0


def test_unknown_logit_processing_is_detected(tiny_llama_dir, monkeypatch):
    be = hf_backend(tiny_llama_dir)
    monkeypatch.setattr(be.model.config, "final_logit_softcapping", 0.5, raising=False)
    # the model itself ignores this field, our head would apply it: the start-up check catches it
    with pytest.raises(ModelError, match="post-processes logits"):
        be._check_head()


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=6),
                                    SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.9)])
def test_finished_rows_leave_the_batch(llama, params):
    """A row that stops early is dropped from the batch and KV cache; the others continue unchanged."""
    reqs = [GenerationRequest(tuple(llama.tokenizer(p, add_special_tokens=False)["input_ids"]), seed=i)
            for i, p in enumerate(PROMPTS)]
    free = llama.generate(reqs, params)
    others = set(free[1].token_ids) | set(free[2].token_ids)
    k = next(k for k in range(1, 5) if free[0].token_ids[k] not in free[0].token_ids[:k]
             and free[0].token_ids[k] not in others)
    saved = llama.stop_ids
    try:
        llama.stop_ids = frozenset({free[0].token_ids[k]})
        got = llama.generate(reqs, params)
    finally:
        llama.stop_ids = saved
    assert (got[0].token_ids, got[0].finish_reason) == (free[0].token_ids[:k], "stop")
    assert [g.token_ids for g in got[1:]] == [f.token_ids for f in free[1:]]
    assert all(g.finish_reason == "length" for g in got[1:])

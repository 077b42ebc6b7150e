"""The stored sequence of a regenerated sample is exactly what the target produced.

token_ids = the prompt ids fed to the target for the final turn + the generated ids verbatim
(stop token included when it stopped, nothing appended otherwise); loss mask = every generated id
plus the template-diff mask of earlier assistant turns inside the prompt. Checked against
``model.generate`` on the tiny random byte-level Llama, where decode -> re-render -> re-tokenize
used to change the ids.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from osprey_data.builder import BuildConfig

from osprey_data.builder.runner import run
from osprey_data.builder.runner import BUILDER_VERSION, SEQUENCE_LAYOUT
from osprey_data.conversation.chat_template import ChatRenderer, stop_token_ids
from osprey_data.errors import ManifestMismatchError
from osprey_data.store import StoreReader, validate_store
from tests.data.conftest import PROMPTS, write_jsonl


def _config(model_dir, inputs, out, **kw) -> BuildConfig:
    base = dict(target=str(model_dir), inputs=tuple(str(i) for i in inputs), out=str(out), device="cpu",
                dtype="float32", max_new_tokens=12, topk=4, batch_size=3, progress=False)
    base.update(kw)
    return BuildConfig(**base)


@pytest.fixture(scope="module")
def greedy_store(tiny_llama_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layout")
    inputs = write_jsonl(tmp / "p.jsonl", PROMPTS)
    store = tmp / "s"
    summary = run(_config(tiny_llama_dir, [inputs], store))
    assert summary.samples_written == len(PROMPTS)
    return store


@pytest.fixture(scope="module")
def target(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    return model, tok, ChatRenderer(tok, stop_ids=stop_token_ids(tok, model.generation_config))


def _samples(store):
    r = StoreReader(str(store))
    return [r.sample(i) for i in range(len(r))]


def test_stored_ids_are_what_model_generate_produced(greedy_store, target):
    model, _, renderer = target
    for s in _samples(greedy_store):
        prompt = renderer.generation_prompt_ids(s.conversation[:-1])
        assert s.token_ids[: s.prompt_length].tolist() == prompt, s.sample_id
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=12, do_sample=False, eos_token_id=sorted(renderer.stop_ids),
                                 pad_token_id=min(renderer.stop_ids))
        generated = out[0, len(prompt):].tolist()
        assert s.token_ids[s.prompt_length:].tolist() == generated, s.sample_id
        # stop token kept and nothing after it; a length stop appends nothing
        stopped = generated[-1] in renderer.stop_ids
        assert s.finish_reason == ("stop" if stopped else "length")
        assert len(generated) == 12 or stopped


def test_greedy_top1_predicts_every_next_generated_token(greedy_store):
    checked = 0
    for s in _samples(greedy_store):
        t = np.arange(s.prompt_length - 1, s.num_tokens - 1)
        assert np.array_equal(s.topk_ids_TK[t, 0], s.token_ids[t + 1]), s.sample_id
        checked += t.size
    assert checked >= len(PROMPTS) * 2


def test_loss_mask_is_generated_ids_plus_earlier_turns(greedy_store, target):
    _, _, renderer = target
    multi_turn = 0
    for s in _samples(greedy_store):
        prompt = renderer.render_prompt(s.conversation[:-1])
        mask = s.loss_mask.tolist()
        assert mask[: s.prompt_length] == prompt.loss_mask.tolist()
        assert all(mask[s.prompt_length:]) and s.num_tokens > s.prompt_length
        if sum(m["role"] == "assistant" for m in s.conversation) > 1:
            multi_turn += 1
            # the earlier (regenerated, re-rendered) turn: its decoded text is masked in the prompt
            masked = [t for t, m in zip(s.token_ids[: s.prompt_length].tolist(), prompt.loss_mask) if m]
            assert masked and renderer.decode_response([t for t in masked if t not in renderer.stop_ids]) \
                == s.conversation[1]["content"]
            assert masked[-1] in renderer.stop_ids  # its end-of-turn token is a target too
        else:
            assert not any(mask[: s.prompt_length])
    assert multi_turn == 2


def test_length_stopped_sample_has_no_closing_tokens(tiny_llama_dir, tmp_path, target):
    _, tok, renderer = target
    inputs = write_jsonl(tmp_path / "p.jsonl", PROMPTS[:2])
    run(_config(tiny_llama_dir, [inputs], tmp_path / "s", max_new_tokens=3, last_turn_only=True))
    for s in _samples(tmp_path / "s"):
        if s.finish_reason != "length":
            continue
        assert s.num_tokens == s.prompt_length + 3
        assert not set(s.token_ids[s.prompt_length:].tolist()) & renderer.stop_ids
        # the template would have closed the turn ("<|im_end|>\n"): none of that is stored
        closed = renderer.render(s.conversation)
        assert closed.num_tokens > s.num_tokens or closed.token_ids.tolist() != s.token_ids.tolist()
        assert np.array_equal(s.loss_mask[s.prompt_length:], np.ones(3, dtype=bool))
        break
    else:
        pytest.fail("no length-stopped sample at max_new_tokens=3")


def test_overflow_truncate_keeps_the_exact_prefix(tiny_llama_dir, tmp_path, greedy_store):
    inputs = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    full = {s.sample_id: s for s in _samples(greedy_store)}
    summary = run(_config(tiny_llama_dir, [inputs], tmp_path / "t", max_length=48))
    cut = _samples(tmp_path / "t")
    assert summary.truncated == sum(s.finish_reason == "truncated" for s in cut) >= 1
    prefixes = 0
    for s in cut:
        ref = full[s.sample_id]
        if s.finish_reason == "truncated" and s.conversation == ref.conversation:
            # same turns kept: the first 48 ids of the exact sequence, mask cut alike
            assert s.token_ids.tolist() == ref.token_ids[:48].tolist()
            assert s.loss_mask.tolist() == ref.loss_mask[:48].tolist()
            prefixes += 1
    assert prefixes >= 1
    assert validate_store(str(tmp_path / "t")).problems == []


def test_old_layout_store_is_refused(tiny_llama_dir, tmp_path, monkeypatch):
    from osprey_data.builder import runner

    inputs = write_jsonl(tmp_path / "p.jsonl", PROMPTS[:1])
    store = tmp_path / "s"
    # a store written by the previous builder: older version, re-tokenized text layout
    monkeypatch.setattr(runner, "BUILDER_VERSION", "osprey-builder/1")
    monkeypatch.setattr(runner, "SEQUENCE_LAYOUT", None)
    run(_config(tiny_llama_dir, [inputs], store))
    monkeypatch.undo()
    with pytest.raises(ManifestMismatchError, match=r"--sequence-layout differs .*builder version differs"):
        run(_config(tiny_llama_dir, [inputs], store))
    fresh = tmp_path / "fresh"
    run(_config(tiny_llama_dir, [inputs], fresh))
    header = StoreReader(str(fresh)).header
    assert header.build_config["sequence_layout"] == SEQUENCE_LAYOUT and header.builder_version == BUILDER_VERSION

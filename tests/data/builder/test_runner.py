"""End-to-end builds on tiny models: contents, policies, errors file, resume, workers, refusal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from osprey_data.builder import BuildConfig

from osprey_data.builder.runner import run
from osprey_data.builder.backends import hf as hf_module
from osprey_data.conversation.chat_template import ChatRenderer, stop_token_ids
from osprey_data.errors import ConfigError, InputError, ManifestMismatchError
from osprey_data.store import StoreReader, merge_store, validate_store
from tests.data.conftest import PROMPTS, write_jsonl

REPO = Path(__file__).resolve().parents[3]


def config(model_dir, inputs, out, **kw) -> BuildConfig:
    base = dict(target=str(model_dir), inputs=tuple(str(i) for i in inputs), out=str(out), device="cpu",
                max_new_tokens=6, topk=8, batch_size=2, progress=False)
    base.update(kw)
    return BuildConfig(**base)


@pytest.mark.parametrize("dtype", ["bf16-autocast", "bfloat16"])
def test_store_header_records_the_precision_the_target_ran_in(tiny_llama_dir, prompts_file, tmp_path, dtype):
    from osprey_data.target_model import precision as prec

    if dtype == "bfloat16" and not {"amx_bf16", "avx512_bf16"} & prec._cpu_flags():
        pytest.skip("prepacked bf16 linears need a CPU with bf16 matrix instructions")
    store = tmp_path / "s"
    run(config(tiny_llama_dir, [prompts_file], store, dtype=dtype, limit=2))
    header = StoreReader(str(store)).header
    assert header.build_config["dtype"] == dtype
    assert header.target.dtype == ("bfloat16" if dtype == "bfloat16" else "float32")  # the weights
    assert validate_store(str(store)).problems == []


def journal_errors(store: Path) -> list[dict]:
    out = []
    for f in sorted((store / "workers").glob("*.json")):
        out += json.loads(f.read_text())["errors"]
    return out


def by_id(store) -> dict:
    r = StoreReader(str(store))
    return {r.sample(i).sample_id: r.sample(i) for i in range(len(r))}


def assert_same_samples(a, b, *, exact: bool) -> None:
    sa, sb = by_id(a), by_id(b)
    assert sorted(sa) == sorted(sb)
    for sid, x in sa.items():
        y = sb[sid]
        assert x.token_ids.tolist() == y.token_ids.tolist(), sid
        assert x.loss_mask.tolist() == y.loss_mask.tolist() and x.prompt_length == y.prompt_length
        assert (x.finish_reason, x.conversation, x.domain) == (y.finish_reason, y.conversation, y.domain)
        if exact:
            assert np.array_equal(x.hidden_TLD, y.hidden_TLD) and np.array_equal(x.topk_ids_TK, y.topk_ids_TK)
            assert np.array_equal(x.topk_logprobs_TK, y.topk_logprobs_TK)
        else:  # other batch composition: float reductions in another order, one bf16 step at most
            np.testing.assert_allclose(x.hidden_TLD, y.hidden_TLD, rtol=1e-2, atol=1e-2)
            np.testing.assert_allclose(x.topk_logprobs_TK, y.topk_logprobs_TK, atol=1e-4)


def test_build_contents_match_the_model(tiny_llama_dir, prompts_file, tmp_path):
    store = tmp_path / "s"
    summary = run(config(tiny_llama_dir, [prompts_file], store, final_hidden=True))
    assert summary.samples_written == 6 and summary.skipped == {} and summary.tokens_written > 0
    assert summary.bytes_per_token > 0 and "6 samples written" in summary.format()
    assert validate_store(str(store)).problems == []
    r = StoreReader(str(store))
    h = r.header
    assert h.taps.layer_ids == (1, 3, 5) and h.topk == 8 and h.has_final_hidden
    assert h.generation["greedy"] and h.generation["max_new_tokens"] == 6 and h.generation["regenerate"]
    assert h.build_config["temperature"] == 0.0 and h.build_config["dtype"] == "float32"
    model = hf_module.HFBackend(config(tiny_llama_dir, [prompts_file], store))
    renderer = ChatRenderer(model.tokenizer, stop_ids=stop_token_ids(model.tokenizer, model.model.generation_config))
    s = r.sample(r.index_of("p1"))
    # every assistant turn regenerated (the given "I am fine" is gone), user turns kept
    assert [m["role"] for m in s.conversation] == ["user", "assistant", "user", "assistant"]
    assert s.conversation[1]["content"] != "I am fine, thank you."
    assert s.conversation[2]["content"] == PROMPTS[1]["conversations"][2]["content"]
    # stored = the final prompt the target was fed + its generated ids (earlier turn re-rendered
    # from text inside that prompt, masked by the template diff); the response decodes to the text
    prompt = renderer.render_prompt(s.conversation[:3])
    assert s.prompt_length == prompt.num_tokens and s.finish_reason in ("stop", "length")
    assert s.token_ids[: s.prompt_length].tolist() == prompt.token_ids.tolist()
    assert s.loss_mask.tolist() == prompt.loss_mask.tolist() + [True] * (s.num_tokens - s.prompt_length)
    assert prompt.loss_mask.any()  # the regenerated first turn is a training target too
    response = [t for t in s.token_ids[s.prompt_length:].tolist() if t not in renderer.stop_ids]
    assert renderer.decode_response(response) == s.conversation[3]["content"]
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor(s.token_ids[None], dtype=torch.long), output_hidden_states=True)
    ref = torch.stack([out.hidden_states[i][0] for i in (1, 3, 5)], dim=1)
    torch.testing.assert_close(torch.from_numpy(s.hidden_TLD), ref.bfloat16().float())  # bf16 codec, exact
    torch.testing.assert_close(torch.from_numpy(s.final_hidden_TD), out.hidden_states[6][0].bfloat16().float())
    lp, ids = torch.log_softmax(out.logits[0], -1).topk(8)
    np.testing.assert_allclose(s.topk_logprobs_TK, lp.numpy(), atol=1e-5)
    # the last turn answers the prompt rendered from the stored conversation
    assert s.token_ids[: s.prompt_length].tolist() == renderer.generation_prompt_ids(s.conversation[:3])


def test_last_turn_only_and_teacher_forcing(tiny_qwen3_dir, prompts_file, tmp_path):
    run(config(tiny_qwen3_dir, [prompts_file], tmp_path / "last", last_turn_only=True))
    s = by_id(tmp_path / "last")["p1"]
    assert s.conversation[1]["content"] == "I am fine, thank you."  # earlier turn kept
    assert s.conversation[3]["content"] != "Paris."
    run(config(tiny_qwen3_dir, [prompts_file], tmp_path / "tf", regenerate=False))
    samples = by_id(tmp_path / "tf")
    assert samples["p1"].conversation[3]["content"] == "Paris." and samples["p1"].finish_reason == "teacher_forced"
    assert StoreReader(str(tmp_path / "tf")).header.generation["regenerate"] is False
    # teacher forcing a final user turn without a reference: error naming file and line, or recorded
    no_ref = write_jsonl(tmp_path / "noref.jsonl", [{"id": "n", "prompt": "hi"}])
    with pytest.raises(InputError, match=r"noref.jsonl:1 .*no 'reference'"):
        run(config(tiny_qwen3_dir, [no_ref], tmp_path / "tf2", regenerate=False))
    summary = run(config(tiny_qwen3_dir, [no_ref], tmp_path / "tf3", regenerate=False, on_error="skip"))
    assert summary.skipped == {"input_error": 1} and summary.samples_written == 0
    assert "no 'reference'" in journal_errors(tmp_path / "tf3")[0]["reason"]


def test_on_error_skip_records_malformed_lines(tiny_llama_dir, prompts_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "ok", "prompt": "hello"}) + "\n{broken\n" + json.dumps({"id": "q"}) + "\n")
    with pytest.raises(InputError, match=r"bad.jsonl:2"):
        run(config(tiny_llama_dir, [bad], tmp_path / "raise"))
    assert not (tmp_path / "raise").exists()  # inputs are checked before anything is created
    store = tmp_path / "skip"
    summary = run(config(tiny_llama_dir, [bad, prompts_file], store, on_error="skip"))
    assert summary.samples_written == 7 and summary.skipped == {"input_error": 2}
    errors = journal_errors(store)
    assert [(Path(e["file"]).name, e["line"]) for e in errors] == [("bad.jsonl", 2), ("bad.jsonl", 3)]
    assert StoreReader(str(store)).manifest.num_errors == 2
    again = run(config(tiny_llama_dir, [bad, prompts_file], store, on_error="skip"))  # resume: no duplicates
    assert again.samples_written == 0 and again.already_done == 7 and len(journal_errors(store)) == 2
    # the malformed line fixed: a rerun builds it (the errors file keys on file:line and reason)
    bad.write_text(json.dumps({"id": "ok", "prompt": "hello"}) + "\n" + json.dumps({"id": "fixed", "prompt": "hi"})
                   + "\n" + json.dumps({"id": "q"}) + "\n")
    fixed = run(config(tiny_llama_dir, [bad, prompts_file], store, on_error="skip"))
    assert fixed.samples_written == 1 and "fixed" in by_id(store)


def test_overflow_policies_are_counted(tiny_llama_dir, prompts_file, tmp_path):
    s = run(config(tiny_llama_dir, [prompts_file], tmp_path / "t", max_length=40))
    stored = by_id(tmp_path / "t").values()
    assert all(x.num_tokens <= 40 for x in stored)
    assert s.truncated >= 1 and s.truncated == sum(x.finish_reason == "truncated" for x in stored)
    s = run(config(tiny_llama_dir, [prompts_file], tmp_path / "k", max_length=40, overflow="skip"))
    assert s.skipped.get("too_long", 0) >= 1 and s.samples_written + s.skipped["too_long"] == 6
    assert all(e["reason"].startswith("too_long") for e in journal_errors(tmp_path / "k"))


def test_non_finite_features_go_to_the_errors_file(tiny_llama_dir, prompts_file, tmp_path, monkeypatch):
    original = hf_module.HFBackend.features

    def poisoned(self, sequences, **kw):
        feats = original(self, sequences, **kw)
        feats[0].hidden_TLD[0, 0, 0] = float("nan")
        return feats

    monkeypatch.setattr(hf_module.HFBackend, "features", poisoned)
    summary = run(config(tiny_llama_dir, [prompts_file], tmp_path / "s"))
    assert summary.skipped == {"non_finite": 3} and summary.samples_written == 3  # first of each batch
    assert all("NaN/Inf in hidden" in e["reason"] for e in journal_errors(tmp_path / "s"))
    assert validate_store(str(tmp_path / "s")).problems == []


def test_changed_config_is_refused_naming_the_setting(tiny_llama_dir, prompts_file, tmp_path):
    store = tmp_path / "s"
    run(config(tiny_llama_dir, [prompts_file], store, limit=2))
    with pytest.raises(ManifestMismatchError, match=r"--topk differs \(store: 8, this run: 4\)"):
        run(config(tiny_llama_dir, [prompts_file], store, topk=4))
    with pytest.raises(ManifestMismatchError, match=r"--max-new-tokens differs"):
        run(config(tiny_llama_dir, [prompts_file], store, max_new_tokens=7))
    # operational settings may change: a bigger limit and another batch size just continue
    s = run(config(tiny_llama_dir, [prompts_file], store, batch_size=3))
    assert (s.already_done, s.samples_written) == (2, 4)


def test_sampling_is_reproducible_across_batch_sizes(tiny_llama_dir, prompts_file, tmp_path):
    kw = dict(temperature=0.9, top_p=0.9, seed=5, max_new_tokens=5)
    run(config(tiny_llama_dir, [prompts_file], tmp_path / "a", batch_size=1, **kw))
    run(config(tiny_llama_dir, [prompts_file], tmp_path / "b", batch_size=4, **kw))
    assert_same_samples(tmp_path / "a", tmp_path / "b", exact=False)
    assert StoreReader(str(tmp_path / "a")).header.generation["seed"] == 5


def test_sampled_store_keeps_temperature_one_logprobs(tiny_llama_dir, prompts_file, tmp_path):
    """A store sampled at T records T and top-p, and its top-k log-probs are the T = 1 full softmax
    (what the sampled-acceptance estimator tempers)."""
    import torch
    from transformers import AutoModelForCausalLM

    run(config(tiny_llama_dir, [prompts_file], tmp_path / "t", temperature=0.5, top_p=1.0, seed=2))
    r = StoreReader(str(tmp_path / "t"))
    g = r.header.generation
    assert (g["greedy"], g["temperature"], g["top_p"], g["topk_logprobs_temperature"]) == (False, 0.5, 1.0, 1.0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir)).eval()
    s = r.sample(0)
    with torch.no_grad():
        logits_TV = model(torch.as_tensor(s.token_ids, dtype=torch.long)[None]).logits[0].double()
    want_TK = torch.log_softmax(logits_TV, -1).gather(1, torch.as_tensor(s.topk_ids_TK, dtype=torch.long))
    np.testing.assert_allclose(s.topk_logprobs_TK, want_TK.numpy(), atol=1e-4)


def test_two_workers_plus_merge_equal_one_worker(tiny_llama_dir, prompts_file, tmp_path, monkeypatch):
    run(config(tiny_llama_dir, [prompts_file], tmp_path / "one"))
    multi = tmp_path / "multi"
    counts = []
    for rank in (0, 1):  # as under torchrun: worker index and count from RANK / WORLD_SIZE
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        cfg = config(tiny_llama_dir, [prompts_file], multi)
        assert (cfg.worker_index, cfg.num_workers) == (rank, 2)
        counts.append(run(cfg).samples_written)
    assert sum(counts) == 6 and min(counts) >= 1
    merge_store(str(multi))
    assert validate_store(str(multi)).problems == []
    assert_same_samples(tmp_path / "one", multi, exact=False)


def test_worker_flags_are_checked():
    with pytest.raises(ConfigError, match="--worker-index"):
        BuildConfig(target="t", inputs=("x",), out="o", num_workers=2, worker_index=2)
    with pytest.raises(ConfigError, match="--top-p"):
        BuildConfig(target="t", inputs=("x",), out="o", top_p=0)
    with pytest.raises(ConfigError, match="--hidden-codec"):
        BuildConfig(target="t", inputs=("x",), out="o", hidden_codec="fp4")


_KILLABLE = """
import sys, time, torch
torch.set_num_threads(1)
from osprey_data.builder import BuildConfig
from osprey_data.builder.runner import run
from osprey_data.builder.backends import hf
original = hf.HFBackend.features
def slow(self, *a, **k):  # slow enough to be killed between shard commits
    time.sleep(0.4)
    return original(self, *a, **k)
hf.HFBackend.features = slow
run(BuildConfig(**__import__("json").loads(sys.argv[1])))
"""


def test_killed_build_resumes_to_the_uninterrupted_result(tiny_llama_dir, tmp_path):
    records = [{**p, "id": f"{p['id']}-{k}"} for k in range(2) for p in PROMPTS]
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    kw = dict(target=str(tiny_llama_dir), inputs=[str(inputs)], device="cpu", max_new_tokens=6, topk=8,
              batch_size=2, shard_max_tokens=100, progress=False)
    run(BuildConfig(**{**kw, "out": str(tmp_path / "ref")}))
    killed = tmp_path / "killed"
    script = tmp_path / "killable.py"
    script.write_text(_KILLABLE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), json.dumps({**kw, "out": str(killed)})], cwd=REPO, env=env)
    manifest = killed / "manifest.json"  # replaced atomically: always whole when it exists
    deadline = time.time() + 60
    try:
        while time.time() < deadline and proc.poll() is None:
            if manifest.exists() and json.loads(manifest.read_text())["num_samples"] > 0:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    partial = StoreReader(str(killed))
    assert 0 < len(partial) < len(records), "the build was not interrupted midway"
    assert validate_store(str(killed)).problems == []  # a killed build leaves a valid store
    summary = run(BuildConfig(**{**kw, "out": str(killed)}))
    # shards committed after the last published manifest are adopted too: nothing is redone twice
    assert summary.already_done >= len(partial)
    assert summary.already_done + summary.samples_written == len(records)
    assert_same_samples(tmp_path / "ref", killed, exact=True)  # same batches: bit-identical

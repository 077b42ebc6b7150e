"""``osprey demo`` on tiny local models through the same ``run()`` (the model fetch replaced by
local fixture folders): a preset of the study runner; plus the shipped prompts and the prompt split.
The fetcher's own tests are in tests/data/target_model/test_packaged.py."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from osprey_data.errors import ConfigError, InputError
from osprey_data.store import StoreReader
from osprey_train.demo.config import DemoConfig
from osprey_train.demo.pipeline import lossless_failure, next_step, run, shipped_prompts, split_prompts
from osprey_train.models import load_drafter


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
                     tokens_per_batch=128, ttt_steps=2, draft_steps=2, live_steps=2, device="cpu", progress=False)
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
    assert set(doc["timings_s"]) >= {"target", "train store", "eval store", "prune", "convert", "distill",
                                     "offline acceptance", "live decoding", "report", "total"}
    # the demo is a study: every stage finished in the study folder, nothing left in work/
    stages = {p.name.split("-")[0] for p in (tmp_path / "demo" / "work" / "stages").iterdir()}
    assert stages == {"model", "prompts", "store", "prune", "convert", "distill", "eval", "live"}
    assert not list((tmp_path / "demo" / "work" / "work").iterdir())
    assert doc["stages_reused"] == 0
    # the drafter and both stores under stable names (relative links into the stage folders)
    demo = tmp_path / "demo"
    assert doc["paths"] == {"drafter": str(demo / "drafter"), "train_store": str(demo / "stores" / "train"),
                            "eval_store": str(demo / "stores" / "eval"),
                            "train_prompts": str(demo / "prompts" / "train.jsonl"),
                            "eval_prompts": str(demo / "prompts" / "eval.jsonl")}
    assert len((demo / "prompts" / "eval.jsonl").read_text(encoding="utf-8").splitlines()) == 5
    # the store and live decoding ran in one precision, and the report says what made verify rows exact
    assert live["precision"]["target"] == "float32"
    assert live["exactness"]["summary"].startswith("verify rows exact by construction")
    assert "Verify rows: verify rows exact" in md and "identical 5/5" in md
    step = next_step(doc)
    assert f"--input {demo / 'prompts' / 'eval.jsonl'}" in step
    # issue 48: the next step repeats what the demo measured (precision, tokens, S, taps) and says how long
    assert " --steps 2 --max-new-tokens 8 --precision float32 --tap-codec bf16 " in step
    assert f"about {doc['timings_s']['live decoding']:.0f} s, as the demo's live stage" in step
    assert lossless_failure(doc) is None
    assert "differs from plain decoding on 1 of 5" in lossless_failure({**doc, "live": {**live, "greedy_identical": 4}})
    for role, link in doc["paths"].items():
        assert Path(link).is_symlink() and Path(link).resolve() == Path(doc["resolved"][role]).resolve()
    assert load_drafter(demo / "drafter").config.arch == "osprey"
    assert len(StoreReader(str(demo / "stores" / "eval"))) == 5
    # a rerun with the same settings reuses every stage and reports the same figures
    again = run(cfg)
    assert again.summary["stages_reused"] == len(list((tmp_path / "demo" / "work" / "stages").iterdir()))
    assert again.summary["offline"] == doc["offline"] and again.summary["live"]["acceptance_length"] == \
        live["acceptance_length"]
    # the default live draft length, auto (issue 46): only the live stage runs again; still lossless
    auto = run(dataclasses.replace(cfg, live_steps="auto"))
    assert auto.summary["stages_reused"] == again.summary["stages_reused"] - 1
    alive = auto.summary["live"]
    assert alive["greedy_identical"] == 5 and alive["draft_length"]["max_steps"] == 5
    assert sum(alive["draft_length"]["rounds_by_steps"].values()) == alive["verify_steps"]
    md = auto.report_md.read_text(encoding="utf-8")
    assert "Draft length: auto (S = 0..5" in md and "--live-steps 2" in md
    assert " --steps auto " in next_step(auto.summary)


def test_demo_config_checks():
    assert DemoConfig(quick=True).sizes["distill_steps"] > 0
    with pytest.raises(ConfigError, match="draft-vocab"):
        DemoConfig(draft_vocab=0)


def test_demo_study_uses_a_draft_vocabulary_capped_at_the_targets(tiny_llama_dir):
    """Issue 46: the presets' 4096-token draft vocabulary (a cheaper draft step); a smaller target keeps all
    of its vocabulary instead of a refusal from convert."""
    from osprey_train.demo.pipeline import demo_study

    assert demo_study(DemoConfig(quick=True)).distill.draft_vocab == 4096   # the default target: not peeked
    vocab = json.loads((Path(tiny_llama_dir) / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    assert vocab < 4096
    assert demo_study(DemoConfig(quick=True, target=str(tiny_llama_dir))).distill.draft_vocab == vocab
    assert demo_study(DemoConfig(quick=True, target=str(tiny_llama_dir), draft_vocab=64)).distill.draft_vocab == 64
    assert DemoConfig().live_steps == "auto" and DemoConfig(live_steps="3").live_steps == 3
    with pytest.raises(ConfigError, match="--live-steps"):
        DemoConfig(live_steps="fast")
    with pytest.raises(ConfigError, match="train-prompts"):
        DemoConfig(train_prompts=0)
    with pytest.raises(ConfigError, match="prompt file"):
        DemoConfig(prompts="/nonexistent/prompts.jsonl")


def test_a_users_own_file_at_a_published_name_is_refused_before_any_stage(tmp_path, tiny_llama_dir, monkeypatch):
    """Issue #45 item 9: OUT/drafter holding the user's own folder stops the demo at once, not after its stages."""
    import osprey_train.demo.pipeline as pipeline

    out = tmp_path / "demo"
    (out / "drafter").mkdir(parents=True)
    (out / "drafter" / "mine.txt").write_text("keep me", encoding="utf-8")
    monkeypatch.setattr(pipeline, "run_study", lambda *a, **k: pytest.fail("a stage ran before the refusal"))
    cfg = DemoConfig(out=out, quick=True, target=str(tiny_llama_dir), source=str(tiny_llama_dir), device="cpu",
                     progress=False)
    with pytest.raises(ConfigError, match="drafter"):
        run(cfg)
    assert (out / "drafter" / "mine.txt").read_text(encoding="utf-8") == "keep me"

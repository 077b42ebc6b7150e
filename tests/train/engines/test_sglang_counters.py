"""``osprey eval engine --engine sglang`` without SGLang (pure Python): SGLang's ``meta_info`` read
into counters, the counters' own consistency, and the losslessness verdict of the report.

The engine itself runs in test_sglang_engine.py (``sglang_cpu``) and test_sglang_gpu.py (``gpu``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from osprey_data.errors import BackendUnavailableError, ConfigError
from osprey_train.engines.compare import counters_consistent, reconcile
from osprey_train.engines import engine_eval
from osprey_train.engines.engine_eval import EngineEvalConfig, _compare_export, cpu_has_amx, sglang_env
from osprey_train.engines.engine_report import EngineReport
from osprey_train.engines.rig import find_rig
from osprey_train.engines.sglang_driver import _sample, per_request_counters
from osprey_train.evaluation.live_prompts import LivePrompt

# one response of 1 (prefill) + 7 tokens, S = 3: rounds accept 3, 0, then 2 of the 2 tokens left
WALK = [(3, 4, 3), (0, 1, 3), (2, 2, 2)]
RESPONSE = [10, 11, 12, 13, 14, 15, 16, 17]


@pytest.fixture(autouse=True)
def amx_cpu(monkeypatch):
    """These tests configure SGLang's CPU engine as on a CPU that can serve it (with AMX)."""
    monkeypatch.setattr(engine_eval, "cpu_has_amx", lambda: True)


def test_sglang_cpu_without_amx_is_refused_before_any_work_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_eval, "cpu_has_amx", lambda: False)
    paths = _paths(tmp_path)
    with pytest.raises(BackendUnavailableError, match="Intel AMX") as err:
        EngineEvalConfig(engine="sglang", device="cpu", **paths)
    assert "--engine vllm" in str(err.value) and "--device cuda" in str(err.value)
    assert not paths["out"].exists()
    EngineEvalConfig(engine="sglang", device="cuda", **paths)  # the GPU engine and vLLM need no AMX
    EngineEvalConfig(engine="vllm", **paths)


def test_the_amx_probe_agrees_with_the_kernels_cpu_flags():
    flags = Path("/proc/cpuinfo")
    if not flags.is_file():
        pytest.skip("no /proc/cpuinfo (not Linux): SGLang's CPU engine is Linux-only")
    assert cpu_has_amx() == (" amx_tile" in flags.read_text())


def test_meta_info_histogram_gives_rounds_and_accepted_drafts_per_position():
    meta = {"spec_verify_ct": 6, "spec_accept_histogram": [1, 2, 0, 3], "spec_num_correct_drafts": 11}
    got = per_request_counters(meta, 3)
    assert got["num_drafts"] == 6 and got["num_accepted_tokens"] == 11 == got["sglang_num_correct_drafts"]
    assert got["accepted_per_pos"] == [5, 3, 3]
    # the newer name wins; no verify round: SGLang leaves both fields out
    assert per_request_counters({"spec_correct_drafts_histogram": [0, 1], "spec_accept_histogram": [9]},
                                2)["accepted_per_pos"] == [1, 0]
    assert per_request_counters({}, 3) == {
        "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": [0, 0, 0],
        "histogram": [], "sglang_num_correct_drafts": None, "sglang_accept_length": None}


def test_the_matched_stop_token_is_put_back_once():
    meta = {"completion_tokens": 3, "finish_reason": {"type": "stop", "matched": 2}, "spec_verify_ct": 1,
            "spec_accept_histogram": [0, 1]}
    assert _sample("a", {"output_ids": [7, 8], "meta_info": meta}, 0.1, 3)["output_ids"] == [7, 8, 2]
    assert _sample("a", {"output_ids": [7, 8, 2], "meta_info": meta}, 0.1, 3)["output_ids"] == [7, 8, 2]
    length = {"completion_tokens": 2, "finish_reason": {"type": "length", "length": 2}}
    assert _sample("a", {"output_ids": [7, 8], "meta_info": length}, 0.1, 0)["output_ids"] == [7, 8]


def test_counters_must_add_up_to_the_output_length():
    assert counters_consistent(tokens=8, rounds=3, accepted=5, steps=3)       # 1 + 3 + 5 = 9: one cut
    assert counters_consistent(tokens=1, rounds=0, accepted=0, steps=3)       # the prefill's token only
    assert not counters_consistent(tokens=8, rounds=3, accepted=3, steps=3)   # 7 tokens at most
    assert not counters_consistent(tokens=1, rounds=1, accepted=3, steps=3)   # 5 emitted, 4 cut: more than S
    assert not counters_consistent(tokens=5, rounds=0, accepted=0, steps=3)   # tokens with no round
    row = reconcile(sample_id="a", domain="d", steps=3, tokens=8,
                    engine={"num_drafts": 3, "accepted_per_pos": [1, 1, 0]}, walk=WALK)
    assert not row.agrees and not row.counters_consistent and "do not add up" in row.why


def _paths(tmp_path):
    (tmp_path / "drafter").mkdir(exist_ok=True)
    (tmp_path / "target").mkdir(exist_ok=True)
    (tmp_path / "p.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    return {"drafter": tmp_path / "drafter", "target": str(tmp_path / "target"), "inputs": (str(tmp_path / "p.jsonl"),),
            "out": tmp_path / "out"}


def test_dtype_follows_the_engine_and_sglang_cpu_refuses_float32(tmp_path):
    paths = _paths(tmp_path)
    assert EngineEvalConfig(engine="sglang", device="cpu", **paths).dtype == "bfloat16"
    assert EngineEvalConfig(engine="vllm", **paths).dtype == "float32"
    assert EngineEvalConfig(engine="sglang", device="cuda", **paths).dtype == "float32"
    with pytest.raises(ConfigError, match="bfloat16 only"):
        EngineEvalConfig(engine="sglang", device="cpu", dtype="float32", **paths)
    with pytest.raises(ConfigError, match="--device"):
        EngineEvalConfig(engine="sglang", device="tpu", **paths)
    env = sglang_env(2, "osprey", "cpu")
    assert env["SGLANG_CPU_OMP_THREADS_BIND"] == "0-1" and env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "osprey_train.drafters.osprey.sglang"
    assert "SGLANG_USE_CPU_ENGINE" not in sglang_env(1, "eagle3", "cuda")


def _run(outputs: dict[str, list[int]], counters: dict[str, list[int]], rounds: int = 3) -> dict:
    samples = [{"id": pid, "output_ids": ids, "seconds": 1.0, "num_drafts": rounds, "accepted_per_pos": counters[pid]}
               for pid, ids in outputs.items()]
    return {"load_s": 1.0, "samples": samples,
            "batched": {"seconds": 1.0, "tokens": sum(len(v) for v in outputs.values()), "samples": samples}}


def _report(tmp_path, spec_outputs: dict[str, list[int]]) -> EngineReport:
    config = EngineEvalConfig(engine="sglang", device="cpu", steps=3, live=False, **_paths(tmp_path))
    prompts = [LivePrompt(sample_id=pid, domain="d", prompt_ids=[1, 2]) for pid in ("a", "b")]
    offline = {p.sample_id: {"prompt_ids": [1, 2], "response_ids": RESPONSE, "walk": WALK} for p in prompts}
    plain = {"load_s": 1.0, "samples": [{"id": p.sample_id, "output_ids": RESPONSE, "seconds": 1.0} for p in prompts],
             "batched": {"seconds": 1.0, "tokens": 16,
                         "samples": [{"id": p.sample_id, "output_ids": RESPONSE} for p in prompts]}}
    counters = {"a": [2, 2, 1], "b": [2, 2, 1]}
    summary = _compare_export(config, tmp_path / "export", _run(spec_outputs, counters), plain, offline, None,
                              prompts)
    return EngineReport(engine="sglang", engine_version="x", torch_version="y", target="t", drafter="d",
                        arch="osprey", steps=3, dtype="bfloat16", threads=1, max_new_tokens=7, num_prompts=2,
                        plain={"load_s": 1.0, "tokens": 16, "seconds": 2.0, "tokens_per_s": 8.0,
                               "batched_tokens_per_s": 16.0}, exports=[summary])


def test_a_speculative_output_off_the_plain_output_is_not_lossless_and_never_agrees(tmp_path):
    good = _report(tmp_path, {"a": RESPONSE, "b": RESPONSE})
    (e,) = good.exports
    assert good.agrees and e.lossless and e.prompts_comparable == 2 == e.comparable_agreeing == e.counters_consistent
    assert e.batched["agrees"] and e.sglang_accept_length == pytest.approx(16 / 6)
    assert "**agrees**" in good.to_markdown()
    # the same counters, but prompt b's speculative output leaves the plain one at token 4
    diverged = RESPONSE[:4] + [99, 98, 97, 96]
    bad = _report(tmp_path, {"a": RESPONSE, "b": diverged})
    (e,) = bad.exports
    assert not bad.agrees and not e.lossless and e.identical["spec_vs_plain"] == 1
    assert e.prompts_comparable == 1 and not e.batched["lossless"]
    b = next(p for p in e.prompts if p["id"] == "b")
    assert "NOT LOSSLESS" in b["why"] and "token 4" in b["why"]
    md = bad.to_markdown()
    assert "**not lossless**" in md and "check nothing" in md and "**agrees**" not in md


def test_missing_sglang_venv_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("OSPREY_SGLANG_VENV", raising=False)
    with pytest.raises(BackendUnavailableError, match="sglang_venv.sh"):
        find_rig("sglang", tmp_path / "nope")
    from osprey_cli.main import cli

    paths = _paths(tmp_path)
    res = CliRunner().invoke(cli, ["eval", "engine", "--engine", "sglang", "--device", "cpu", "--drafter",
                                   str(paths["drafter"]), "--target", paths["target"], "--input", paths["inputs"][0],
                                   "--out", str(paths["out"]), "--venv", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "sglang engine venv" in res.output and "sglang_venv.sh" in res.output


def test_the_invariant_holds_on_every_committed_vllm_measurement():
    """vLLM's per-request counters of docs/results/engines (40 requests of SmolLM2): the rule, which
    now takes part in every engine's verdict, holds on real engine figures, overcount included."""
    reports = sorted((Path(__file__).resolve().parents[3] / "docs" / "results" / "engines").glob("*/report.json"))
    assert reports
    for path in reports:
        doc = json.loads(path.read_text(encoding="utf-8"))
        for p in (p for e in doc["exports"] for p in e["prompts"]):
            assert counters_consistent(p["tokens"], p["engine_rounds"], sum(p["engine_per_pos"]), doc["steps"]), \
                (path, p["id"])

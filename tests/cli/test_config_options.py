"""Options come from the config classes: adding an option is adding one documented field.

A throwaway config stands for a stage config someone extends: its new field must appear as a
click option (flag from the name, type from the annotation, default from the field, help from the
docstring), parse back into the config, be a key of a study table, and change the stage key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from osprey_cli.config_options import ConfigOptions
from osprey_cli.main import COMMANDS, cli
from osprey_data.config_fields import config_fields, field_docs
from osprey_data.errors import ConfigError
from osprey_train.study.config import _parse_table
from osprey_train.study.plan import Node
from osprey_train.study.stage_tables import Source, stage_table
from osprey_train.trainer import LoopConfig


@dataclass(kw_only=True)
class ToyConfig:
    """A stage config as they all are: typed fields, one docstring each, value checks."""

    source: Path
    """Input folder."""
    loop: LoopConfig
    """The trainer's loop (its options are expanded)."""
    width: int = 8
    """Hidden width of the toy.

    Only the first paragraph is the help."""
    mode: str = field(default="fast", metadata={"choices": ("fast", "exact")})
    """How the toy runs."""

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ConfigError(f"toy: --width must be >= 1, got {self.width}")


@dataclass(kw_only=True)
class ToyConfigPlus(ToyConfig):
    """The same config after someone added one field: nothing else changes anywhere."""

    dropout: float = 0.1
    """Dropout rate of the toy."""


def _command(cls: type) -> tuple[click.Command, dict]:
    options, seen = ConfigOptions(cls), {}

    @click.command("toy")
    @options
    def toy(**params):
        seen["config"] = options.config(params)

    return toy, seen


def test_a_new_field_is_a_new_option_with_its_default_and_help():
    toy, seen = _command(ToyConfigPlus)
    params = {p.name: p for p in toy.params}
    assert "dropout" not in {p.name for p in _command(ToyConfig)[0].params}
    assert params["dropout"].default == 0.1 and params["dropout"].type is click.FLOAT
    assert params["width"].help == "Hidden width of the toy." and params["width"].default == 8
    assert list(params["mode"].type.choices) == ["fast", "exact"]
    assert params["source"].required and params["out"].required and params["steps"].default == 1000    # LoopConfig.max_steps -> --steps
    help_text = CliRunner().invoke(toy, ["--help"]).output
    assert "--dropout FLOAT" in help_text and "Dropout rate of the toy." in help_text and "0.1" in help_text
    res = CliRunner().invoke(toy, ["--source", "i", "--out", "o", "--dropout", "0.25", "--steps", "3",
                                   "--mode", "exact"])
    assert res.exit_code == 0, res.output
    config = seen["config"]
    assert isinstance(config, ToyConfigPlus) and config.dropout == 0.25 and config.mode == "exact"
    assert config.loop == LoopConfig(out_dir=Path("o"), max_steps=3) and config.source == Path("i")
    assert CliRunner().invoke(toy, ["--source", "i", "--out", "o", "--mode", "slow"]).exit_code == 2  # a choice


def test_a_new_field_is_a_study_key_and_changes_the_stage_key(tmp_path):
    table = stage_table("ToySection", "[toy]", Source(ToyConfigPlus, wired=("source", "out", "resume", "extra"),
                                                        placeholders={"source": Path("<in>"), "out": Path("<out>")}))
    where = "study.toml: [toy]"
    parsed = _parse_table(table, {"dropout": 0.5, "width": 4}, where, tmp_path)
    assert (parsed.dropout, parsed.width, parsed.mode) == (0.5, 4, "fast")
    parsed.check(where)
    config = parsed.build(ToyConfigPlus, source=tmp_path, out=tmp_path / "run")
    assert config.dropout == 0.5 and config.loop.out_dir == tmp_path / "run"
    default = Node("toy", table())
    assert Node("toy", dataclasses.replace(table(), dropout=0.5)).key != default.key
    assert Node("toy", dataclasses.replace(table(), save_every=7)).key == default.key   # operational
    with pytest.raises(ConfigError, match=r"\[toy\] dropout: expected a number, got 'x'"):
        _parse_table(table, {"dropout": "x"}, where, tmp_path)
    with pytest.raises(ConfigError, match=r"\[toy\]: toy: --width must be >= 1"):
        _parse_table(table, {"width": 0}, where, tmp_path).check(where)
    with pytest.raises(ConfigError, match=r"unknown key 'out'"):     # wired: the study sets it
        _parse_table(table, {"out": "x"}, where, tmp_path)


def test_every_field_documents_itself():
    @dataclass
    class Undocumented:
        x: int = 1

    with pytest.raises(TypeError, match="Undocumented.x has no docstring"):
        config_fields(Undocumented)
    assert field_docs(ToyConfigPlus)["width"].startswith("Hidden width")    # inherited fields too


@pytest.mark.parametrize("path", [("data", "build"), ("train", "prune"), ("train", "convert"),
                                  ("train", "pretrain"), ("train", "distill"), ("eval", "acceptance"),
                                  ("eval", "live")])
def test_generated_commands_show_the_config_defaults(path):
    ctx = click.Context(cli)
    cmd = cli.get_command(ctx, path[0]).get_command(ctx, path[1])
    assert path[1] in COMMANDS[path[0]]
    module = __import__(COMMANDS[path[0]][path[1]].split(":")[0], fromlist=["x"])
    options = [v for v in vars(module).values() if isinstance(v, ConfigOptions)]
    assert options, f"{path}: no generated options"
    params = {p.name: p for p in cmd.params}
    for opts in options:
        for c in opts.fields:
            if c.name in params and not c.required and not c.metadata.get("negate"):
                default = params[c.name].default
                assert default == (list(c.default) if isinstance(default, list) else c.default), (path, c.name)

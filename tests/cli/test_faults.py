"""Faults at the command line: one exit-code scheme, OS errors as one line naming the path, cheap
checks before any model loads, untrusted strings escaped (issue #12, items 3, 5, 14, 16)."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from click.testing import CliRunner
from osprey_cli import store_cmds
from osprey_cli.main import cli

from osprey_data.errors import Interrupted
from osprey_train.evaluation import live as live_module


@pytest.fixture(scope="module")
def random_drafter(tmp_path_factory):
    from osprey_train.drafters.osprey.model import OspreyDrafter
    from osprey_train.models import DrafterConfig, save_drafter

    torch.manual_seed(0)
    return save_drafter(OspreyDrafter(DrafterConfig.from_name("tiny")), tmp_path_factory.mktemp("drafter") / "d")


@pytest.fixture()
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before a cheap check failed")

    monkeypatch.setattr(live_module, "load_hf_target", refuse)
    monkeypatch.setattr(live_module, "load_drafter", refuse)


def test_os_errors_are_one_line_naming_the_path_exit_2(monkeypatch, tmp_path):
    def denied(config):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "s" / "manifest.json"))

    monkeypatch.setattr(store_cmds, "run_inspect", denied)
    result = CliRunner().invoke(cli, ["data", "inspect", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 's' / 'manifest.json'}: Permission denied"


def test_interrupted_commands_exit_128_plus_the_signal(monkeypatch, tmp_path):
    def interrupted(config):
        raise Interrupted("stopped after saving 3 samples", signum=15)

    monkeypatch.setattr(store_cmds, "run_inspect", interrupted)
    result = CliRunner().invoke(cli, ["data", "inspect", str(tmp_path)])
    assert result.exit_code == 143 and "interrupted: stopped after saving 3 samples" in result.output


def test_error_lines_escape_control_characters(monkeypatch, tmp_path):
    from osprey_data.errors import StoreCorruptError

    def crafted(config):
        raise StoreCorruptError("shards/x\nproblem: forged\x1b[2J: missing")

    monkeypatch.setattr(store_cmds, "run_inspect", crafted)
    result = CliRunner().invoke(cli, ["data", "inspect", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "\x1b" not in result.output
    assert "x\\nproblem: forged\\x1b[2J" in result.output


def test_live_missing_input_fails_before_any_model_loads(random_drafter, tiny_llama_dir, tmp_path, no_model_loads):
    result = CliRunner().invoke(cli, ["eval", "live", "--drafter", str(random_drafter), "--target",
                                      str(tiny_llama_dir), "--input", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 2 and "--input" in result.output and "does not exist" in result.output


def test_live_malformed_input_fails_before_any_model_loads(random_drafter, tiny_llama_dir, tmp_path,
                                                           no_model_loads):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "fine"}) + "\n{oops\n")
    result = CliRunner().invoke(cli, ["eval", "live", "--drafter", str(random_drafter), "--target",
                                      str(tiny_llama_dir), "--input", str(bad), "--device", "cpu"])
    assert result.exit_code == 2 and "bad.jsonl:2" in result.output


def test_acceptance_missing_store_fails_before_the_drafter_loads(random_drafter, tmp_path, monkeypatch):
    from osprey_train.evaluation import acceptance

    monkeypatch.setattr(acceptance, "load_drafter", lambda *a, **k: pytest.fail("drafter loaded"))
    result = CliRunner().invoke(cli, ["eval", "acceptance", "--drafter", str(random_drafter), "--store",
                                      str(tmp_path / "nope")])
    assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output

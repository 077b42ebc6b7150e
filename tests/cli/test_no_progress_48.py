"""``--no-progress`` hides every bar, the libraries' too (issue 48): transformers draws ``Loading
weights`` and ``Writing model shards`` bars of its own, and the vocabulary alignment of a study's
convert stage drew one without a progress option to turn it off."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click
from click.testing import CliRunner
from transformers.utils import logging as hf_logging

from osprey_cli.config_options import ConfigOptions
from osprey_cli.main import cli
from osprey_data.progress import bars_enabled, progress_bars
from osprey_train.study.config import load_study
from tests.train.study.test_report_quick_48 import _quick_on_tiny


@dataclass(kw_only=True)
class _Config:
    steps: int = 1
    """Steps."""
    progress: bool = True
    """Show progress bars."""


def test_no_progress_turns_the_library_bars_off_for_the_command_only():
    options = ConfigOptions(_Config)
    seen = []

    @click.command()
    @options
    def command(**params):
        options.config(params)
        seen.append((bars_enabled(), hf_logging.is_progress_bar_enabled()))

    assert hf_logging.is_progress_bar_enabled()
    assert CliRunner().invoke(command, ["--no-progress"]).exit_code == 0
    assert CliRunner().invoke(command, []).exit_code == 0
    assert seen == [(False, False), (True, True)]
    assert bars_enabled() and hf_logging.is_progress_bar_enabled()   # restored when the command ends


def test_progress_bars_nest_and_restore():
    with progress_bars(False):
        with progress_bars(False):
            assert not bars_enabled()
        assert not bars_enabled() and not hf_logging.is_progress_bar_enabled()
        with progress_bars(True):
            assert not bars_enabled()   # True changes nothing inside an off block
    assert bars_enabled() and hf_logging.is_progress_bar_enabled()


def test_study_run_no_progress_prints_no_bar(tmp_path, tiny_llama_dir):
    path = _quick_on_tiny(tmp_path / "spec", Path(tiny_llama_dir))
    load_study(path)
    res = CliRunner().invoke(cli, ["study", "run", str(path), "--out", str(tmp_path / "out"), "--no-progress"])
    assert res.exit_code == 0, res.output
    for bar in ("Loading weights", "Writing model shards", "vocab alignment", "it/s]", "%|"):
        assert bar not in res.output, res.output
    assert "stages run" in res.output


class _Stop(Exception):
    pass


def test_vocab_alignment_follows_the_switch(monkeypatch, tiny_tokenizer):
    """The bar of a large vocabulary (30k target tokens), made with progress=True as train convert
    makes it: on outside an off block, off inside one."""
    import pytest

    import osprey_train.stages.vocab_align as va

    made = []

    def spy(*args, **kwargs):
        made.append(kwargs["disable"])
        raise _Stop

    monkeypatch.setattr(va, "tqdm", spy)
    for enabled in (True, False):
        with progress_bars(enabled), pytest.raises(_Stop):
            va.align_vocab(tiny_tokenizer, tiny_tokenizer, target_vocab_size=30000, source_vocab_size=30000)
    assert made == [False, True]

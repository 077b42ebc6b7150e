"""The package imports without optional extras and the CLI lists every subcommand."""

from __future__ import annotations

import importlib

import pytest
from click.testing import CliRunner

from osprey_cli.main import COMMANDS, cli


def test_every_cli_command_imports():
    runner = CliRunner()
    for group, commands in COMMANDS.items():
        for name in commands:
            args = ([group] if group else []) + [name, "--help"]
            result = runner.invoke(cli, args)
            assert result.exit_code == 0, (args, result.output, result.exception)


@pytest.mark.parametrize("module", ["osprey_data", "osprey_train", "osprey_cli.main", "osprey_schemas"])
def test_imports_without_sglang(module):
    importlib.import_module(module)
    import sys

    assert "sglang" not in sys.modules


def test_tiny_fixtures_load(tiny_llama_dir, tiny_qwen3_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    for path in (tiny_llama_dir, tiny_qwen3_dir):
        model = AutoModelForCausalLM.from_pretrained(path)
        assert model.config.vocab_size == len(tiny_tokenizer)
    rendered = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith("<|im_start|>assistant\n")

"""``osprey demo`` through the CLI: options parse into DemoConfig; bad values exit with one line.
(The pipeline itself runs on tiny models in tests/train/demo.)"""

from __future__ import annotations

from click.testing import CliRunner

from osprey_cli.main import cli


def test_demo_help_lists_the_options():
    result = CliRunner().invoke(cli, ["demo", "--help"])
    assert result.exit_code == 0
    for option in ("--quick", "--out", "--target", "--source", "--prompts", "--device", "--threads"):
        assert option in result.output


def test_demo_bad_size_is_one_line_error(tmp_path):
    result = CliRunner().invoke(cli, ["demo", "--quick", "--out", str(tmp_path / "d"), "--train-prompts", "0"])
    assert result.exit_code == 2
    assert "error: demo: train-prompts must be a positive integer" in result.output


def test_demo_missing_prompt_file_is_one_line_error(tmp_path):
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "d"), "--prompts", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2
    assert "does not exist" in result.output

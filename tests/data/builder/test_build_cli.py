"""``osprey data build`` parses its flags into BuildConfig and reports a summary."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.errors import ConfigError
from osprey_data.store import StoreReader
from osprey_data.target_model import parse_taps


def test_cli_build_writes_a_store(tiny_llama_dir, prompts_file, tmp_path):
    out = tmp_path / "store"
    args = ["data", "build", "--target", str(tiny_llama_dir), "--input", str(prompts_file), "--input",
            str(prompts_file.with_name("p2.jsonl")), "--out", str(out), "--device", "cpu", "--max-new-tokens", "4",
            "--topk", "4", "--taps", "1,2,5", "--limit", "3", "--batch-size", "2", "--last-turn-only",
            "--final-hidden", "--temperature", "0.5", "--top-p", "0.8", "--seed", "3", "--max-length", "300",
            "--overflow", "skip", "--on-error", "skip", "--hidden-codec", "fp8"]
    prompts_file.with_name("p2.jsonl").write_text('{"prompt": "hi there"}\n')
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "3 samples written" in result.output
    h = StoreReader(str(out)).header
    assert h.taps.layer_ids == (1, 2, 5) and h.topk == 4 and h.hidden_codec == "fp8" and h.has_final_hidden
    g = h.generation
    assert (g["temperature"], g["top_p"], g["seed"], g["last_turn_only"], g["max_new_tokens"]) == (0.5, 0.8, 3, True, 4)
    assert (g["max_length"], g["overflow"]) == (300, "skip")
    assert g["topk_logprobs_temperature"] == 1.0  # log-probs stay at T = 1 whatever --temperature


def test_cli_errors_are_one_line(tmp_path, tiny_llama_dir, prompts_file):
    result = CliRunner().invoke(cli, ["data", "build", "--target", str(tmp_path / "nope"), "--input",
                                      str(prompts_file), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no such folder" in result.output
    result = CliRunner().invoke(cli, ["data", "build", "--target", str(tiny_llama_dir), "--input",
                                      str(prompts_file), "--out", str(tmp_path / "o"), "--taps", "1,99",
                                      "--device", "cpu"])
    assert result.exit_code == 2 and "outside 1..5 for a target of 6 layers" in result.output
    for layers, message in (("3,1,5", "strictly increasing"), ("2,2,5", "strictly increasing"), ("0,2,5", ">= 1")):
        result = CliRunner().invoke(cli, ["data", "build", "--target", str(tiny_llama_dir), "--input",
                                          str(prompts_file), "--out", str(tmp_path / "bad"), "--taps", layers])
        assert result.exit_code == 2 and "--taps: tap layers" in result.output and message in result.output
        assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_one_tap_parser_and_the_old_flag_name(tmp_path, tiny_llama_dir, prompts_file):
    assert parse_taps("2, 15,27") == (2, 15, 27) and parse_taps(None) is None and parse_taps("") is None
    with pytest.raises(ConfigError, match="comma-separated integers"):
        parse_taps("a,b")
    base = ["data", "build", "--target", str(tiny_llama_dir), "--input", str(prompts_file), "--device", "cpu"]
    result = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "x"), "--taps", "a,b"])
    assert result.exit_code == 2 and "comma-separated integers" in result.output
    # --layers, the old name, still works (hidden from --help); both at once is refused
    result = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "o"), "--layers", "1,99"])
    assert result.exit_code == 2 and "outside 1..5" in result.output
    result = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / "o"), "--layers", "1,2", "--taps", "1,3"])
    assert result.exit_code == 2 and "same option" in result.output
    assert "--layers" not in CliRunner().invoke(cli, ["data", "build", "--help"]).output

"""``osprey eval live`` through the CLI: a real run on a tiny target, JSON output, error exits."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from osprey_cli.main import cli


@pytest.fixture(scope="module")
def random_drafter(tmp_path_factory):
    from osprey_train.drafters.osprey.model import OspreyDrafter
    from osprey_train.models import DrafterConfig, save_drafter

    torch.manual_seed(0)
    model = OspreyDrafter(DrafterConfig.from_name("tiny"))
    return save_drafter(model, tmp_path_factory.mktemp("drafter") / "d")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    rows = [{"id": f"p{i}", "domain": d, "conversations": [{"role": "user", "content": f"Question {i} about {d}?"}]}
            for i, d in enumerate(["chat", "math", "code"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_live_json_output(random_drafter, prompt_file, tiny_llama_dir, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(cli, [
            "eval", "live", "--drafter", str(random_drafter), "--target", str(tiny_llama_dir),
            "--input", str(prompt_file), "--steps", "2", "--max-new-tokens", "6", "--device", "cpu",
            "--json", "--out", str(tmp_path / "live.json")])
    finally:
        torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{"):])
    assert doc["num_prompts"] == 3 and doc["greedy_identical"] == 3
    assert set(doc["per_domain"]) == {"chat", "math", "code"}
    assert doc["speedup"] > 0
    assert json.loads((tmp_path / "live.json").read_text())["samples"]


def test_live_bad_option_is_one_line_error(random_drafter, prompt_file, tiny_llama_dir):
    result = CliRunner().invoke(cli, ["eval", "live", "--drafter", str(random_drafter), "--target",
                                      str(tiny_llama_dir), "--input", str(prompt_file), "--steps", "0"])
    assert result.exit_code == 2
    assert "error: live: --steps must be 'auto' or a positive integer, got 0" in result.output


def test_live_missing_target_is_one_line_error(random_drafter, prompt_file, tmp_path):
    result = CliRunner().invoke(cli, ["eval", "live", "--drafter", str(random_drafter), "--target",
                                      str(tmp_path / "missing"), "--input", str(prompt_file)])
    assert result.exit_code == 2
    assert "error:" in result.output and "Traceback" not in result.output


def test_live_show_text_prints_and_returns_the_generated_text(random_drafter, prompt_file, tiny_llama_dir,
                                                              tiny_tokenizer):
    base = ["eval", "live", "--drafter", str(random_drafter), "--target", str(tiny_llama_dir), "--input",
            str(prompt_file), "--steps", "2", "--max-new-tokens", "4", "--device", "cpu", "--no-baseline",
            "--threads", "1", "--show-text"]
    result = CliRunner().invoke(cli, [*base, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{"):])
    assert [t["id"] for t in doc["texts"]] == ["p0", "p1", "p2"]
    assert all(isinstance(t["text"], str) and t["text"] for t in doc["texts"])
    result = CliRunner().invoke(cli, base)
    assert result.exit_code == 0, result.output
    shown = result.output.split("## Generated text", 1)[1]
    from osprey_data.text import printable_text

    for t in doc["texts"]:   # greedy: the same text again (control characters escaped for the terminal)
        assert f"### {t['id']} ({t['domain']})" in shown and printable_text(t["text"]).strip() in shown
    result = CliRunner().invoke(cli, [*base[:-1]])
    assert "## Generated text" not in result.output


def test_live_chat_template_options_are_checked_first(random_drafter, prompt_file, tmp_path):
    base = ["eval", "live", "--drafter", str(random_drafter), "--target", str(tmp_path / "missing"),
            "--input", str(prompt_file)]
    result = CliRunner().invoke(cli, [*base, "--chat-template-kwargs", "[true]"])
    assert result.exit_code == 2 and "--chat-template-kwargs must be a JSON object" in result.output
    (tmp_path / "bad.jinja").write_text("{% if %}")
    result = CliRunner().invoke(cli, [*base, "--chat-template", str(tmp_path / "bad.jinja")])
    assert result.exit_code == 2 and "not a valid Jinja template" in result.output

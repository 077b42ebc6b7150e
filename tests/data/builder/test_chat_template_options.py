"""``osprey data build --chat-template FILE --chat-template-kwargs JSON`` and ``osprey data show``.

A build renders with the given template and variables (the stored text shows both), the header
records the template's hash and the variables, and a bad template or kwargs fails before the
target loads. ``data show`` prints a sample with its loss mask marked, as text or JSON.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.store import StoreReader
from osprey_data.store.show import ShowConfig, loss_spans, run
from osprey_data.text import printable_text

# ChatML with a variable and a marker of its own, so the stored text shows which template ran
TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + tag + ' ' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' + tag + ' ' }}{% endif %}"
)
PROMPTS = [{"id": "q0", "domain": "math", "conversations": [{"role": "user", "content": "What is two plus two?"}],
            "reference": "Four."},
           {"id": "q1", "domain": "chat", "conversations": [{"role": "user", "content": "Hello there!"}],
            "reference": "Hi."}]


@pytest.fixture(scope="module")
def built(tiny_llama_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tmpl")
    (tmp / "t.jinja").write_text(TEMPLATE, encoding="utf-8")
    (tmp / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    out = tmp / "store"
    res = CliRunner().invoke(cli, ["data", "build", "--target", str(tiny_llama_dir), "--input", str(tmp / "p.jsonl"),
                                   "--out", str(out), "--device", "cpu", "--no-regenerate", "--topk", "4",
                                   "--no-progress", "--chat-template", str(tmp / "t.jinja"),
                                   "--chat-template-kwargs", '{"tag": "TAG42"}'])
    assert res.exit_code == 0, res.output
    return out


def test_the_template_and_its_variables_render_and_are_recorded(built):
    h = StoreReader(str(built)).header
    assert h.chat_template_hash == hashlib.sha256(TEMPLATE.encode()).hexdigest()
    assert h.generation["chat_template_kwargs"] == {"tag": "TAG42"}
    assert h.build_config["chat_template_kwargs"] == {"tag": "TAG42"}
    shown = run(ShowConfig(store=str(built), sample="q0"))
    text = "".join(s.text for s in shown.spans)
    assert "TAG42 What is two plus two?" in text and "TAG42 Four." in text
    # the trained text is the answer and its end-of-turn token, the prompt is context only
    trained = "".join(s.text for s in shown.spans if s.loss)
    assert "Four." in trained and "two plus two" not in trained
    assert shown.loss_tokens == sum(s.num_tokens for s in shown.spans if s.loss) > 0
    assert sum(s.num_tokens for s in shown.spans) == shown.num_tokens


def test_resuming_with_other_template_kwargs_is_refused_naming_them(built, tiny_llama_dir):
    res = CliRunner().invoke(cli, ["data", "build", "--target", str(tiny_llama_dir), "--input",
                                   str(built.parent / "p.jsonl"), "--out", str(built), "--device", "cpu",
                                   "--no-regenerate", "--topk", "4", "--no-progress",
                                   "--chat-template", str(built.parent / "t.jinja"),
                                   "--chat-template-kwargs", '{"tag": "OTHER"}'])
    assert res.exit_code == 2 and "--chat-template-kwargs differs" in res.output, res.output


def test_show_cli_marks_the_loss_mask_as_text_and_json(built):
    res = CliRunner().invoke(cli, ["data", "show", "--store", str(built), "--sample", "1", "--color", "never"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("sample 1 q1") and "[[ ]]" in lines[1]
    # the generation prompt (the template's "TAG42 " included) is context; the answer is trained on
    assert "assistant\nTAG42 [[Hi.<|im_end|>]]" in res.output
    assert "\x1b" not in res.output
    res = CliRunner().invoke(cli, ["data", "show", "--store", str(built), "--sample", "q1", "--json"])
    doc = json.loads(res.output)
    assert doc["sample_id"] == "q1" and doc["index"] == 1 and {s["loss"] for s in doc["spans"]} == {True, False}
    res = CliRunner().invoke(cli, ["data", "show", "--store", str(built), "--sample", "0", "--color", "always"])
    assert "\x1b[1m" in res.output and "\x1b[2m" in res.output


def test_show_refuses_a_missing_sample_and_a_foreign_tokenizer(built, tmp_path):
    res = CliRunner().invoke(cli, ["data", "show", "--store", str(built), "--sample", "7"])
    assert res.exit_code == 2 and "out of range" in res.output and "2 samples" in res.output
    res = CliRunner().invoke(cli, ["data", "show", "--store", str(built), "--sample", "nope"])
    assert res.exit_code == 2 and "'nope'" in res.output
    from tests.helpers.tiny import make_tiny_tokenizer

    other_dir = tmp_path / "other"
    make_tiny_tokenizer(other_dir, vocab_size=300)
    res = CliRunner().invoke(cli, ["data", "show", "--store", str(built), "--tokenizer", str(other_dir)])
    assert res.exit_code == 2 and "not the store's" in res.output, res.output


def test_loss_spans_and_terminal_text():
    spans = loss_spans([1, 2, 3, 4, 5], [0, 0, 1, 1, 0], lambda ids: ",".join(map(str, ids)))
    assert [(s.loss, s.num_tokens, s.text) for s in spans] == [(False, 2, "1,2"), (True, 2, "3,4"), (False, 1, "5")]
    assert loss_spans([], [], str) == []
    assert printable_text("a\nb\tc\x1b[2J") == "a\nb\tc\\x1b[2J"


@pytest.mark.parametrize("content,kwargs,message", [
    ("{% for m in messages %}", None, "not a valid Jinja template"),
    ("", None, "is empty"),
    (None, "[1, 2]", "must be a JSON object"),
    (None, "{enable_thinking: false}", "not JSON"),
])
def test_a_bad_template_or_kwargs_fails_before_the_target_loads(tmp_path, content, kwargs, message):
    args = ["data", "build", "--target", "/nonexistent/model", "--input", "/nonexistent/p.jsonl",
            "--out", str(tmp_path / "out")]
    if content is not None:
        (tmp_path / "t.jinja").write_text(content)
        args += ["--chat-template", str(tmp_path / "t.jinja")]
    if kwargs is not None:
        args += ["--chat-template-kwargs", kwargs]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and message in res.output, res.output
    assert "nonexistent" not in res.output.replace(str(tmp_path), "") and not (tmp_path / "out").exists()

"""Live prompts render as the builder's do, chat-template variables and template files included."""

from __future__ import annotations

import json

from osprey_data.conversation import ChatRenderer, use_chat_template
from osprey_train.evaluation.live_prompts import load_prompts

TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + (tag or '') + m['content'] + "
            "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_template_kwargs_and_file_reach_the_prompt_ids(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "conversations": [{"role": "user", "content": "Hello there"}]}) + "\n")
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    default = load_prompts((str(path),), tok)[0].prompt_ids
    use_chat_template(tok, TEMPLATE)
    tagged = load_prompts((str(path),), tok, template_kwargs={"tag": "NOTE: "})[0].prompt_ids
    assert tagged != default
    assert "NOTE: Hello there" in tok.decode(tagged)
    expected = ChatRenderer(tok, stop_ids={0}, template_kwargs={"tag": "NOTE: "}).generation_prompt_ids(
        [{"role": "user", "content": "Hello there"}])
    assert tagged == expected   # exactly the builder's rendering

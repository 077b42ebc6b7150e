"""Loss masks by prefix diffing: golden tests for ChatML, Llama-3 and Qwen3 with thinking."""

from __future__ import annotations

import numpy as np
import pytest

from osprey_data.conversation.chat_template import ChatRenderer, stop_token_ids
from osprey_data.errors import InputError, ModelError

CONV = [
    {"role": "system", "content": "Be nice."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi there."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Two plus two is four."},
]


def masked_spans(tokenizer, rendered) -> list[str]:
    """Decoded text of each run of consecutive masked tokens."""
    spans, cur = [], []
    for tok, m in zip(rendered.token_ids.tolist(), rendered.loss_mask.tolist()):
        if m:
            cur.append(tok)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    return [tokenizer.decode(s, skip_special_tokens=False) for s in spans]


def unmasked_text(tokenizer, rendered) -> str:
    return tokenizer.decode(rendered.token_ids[: rendered.prompt_length].tolist(), skip_special_tokens=False)


def test_chatml_golden(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer, stop_ids=stop_token_ids(tiny_tokenizer))
    out = r.render(CONV)
    assert out.text == ("<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
                        "<|im_start|>assistant\nHi there.<|im_end|>\n<|im_start|>user\nWhat is two plus two?"
                        "<|im_end|>\n<|im_start|>assistant\nTwo plus two is four.<|im_end|>\n")
    assert masked_spans(tiny_tokenizer, out) == ["Hi there.<|im_end|>", "Two plus two is four.<|im_end|>"]
    # the trailing newline after the last <|im_end|> is template decoration, not a target
    assert not out.loss_mask[-1] and out.token_ids.dtype == np.int32
    assert unmasked_text(tiny_tokenizer, out).endswith("What is two plus two?<|im_end|>\n<|im_start|>assistant\n")
    # the prompt part is exactly what the target is asked to continue
    assert out.token_ids[: out.prompt_length].tolist() == r.generation_prompt_ids(CONV[:4])


def test_llama3_golden(llama3_tokenizer):
    tok = llama3_tokenizer
    r = ChatRenderer(tok, stop_ids=stop_token_ids(tok))
    out = r.render(CONV)
    assert out.text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe nice.<|eot_id|>")
    assert out.text.count("<|begin_of_text|>") == 1  # no second BOS from the tokenizer
    assert masked_spans(tok, out) == ["Hi there.<|eot_id|>", "Two plus two is four.<|eot_id|>"]
    assert out.loss_mask[-1]  # Llama-3 ends with <|eot_id|>, nothing after it
    assert unmasked_text(tok, out).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_qwen3_thinking_golden(qwen3_tokenizer):
    tok = qwen3_tokenizer
    conv = [dict(m) for m in CONV]
    conv[2]["content"] = "<think>\ngreet back\n</think>\n\nHi there."
    conv[4]["content"] = "<think>\nadd them\n</think>\n\nTwo plus two is four."
    r = ChatRenderer(tok, stop_ids=stop_token_ids(tok))
    out = r.render(conv)
    # Qwen3 drops the reasoning of turns before the last user message; keeps the last one's
    assert "greet back" not in out.text and "<think>\nadd them\n</think>\n\n" in out.text
    assert masked_spans(tok, out) == ["Hi there.<|im_end|>",
                                      "<think>\nadd them\n</think>\n\nTwo plus two is four.<|im_end|>"]


def test_qwen3_thinking_disabled_multi_turn(qwen3_tokenizer):
    """enable_thinking=False: the generation prompt has an empty think block that earlier turns
    do not keep, so the prefix only matches up to the header — the diff still finds the body."""
    tok = qwen3_tokenizer
    r = ChatRenderer(tok, stop_ids=stop_token_ids(tok), template_kwargs={"enable_thinking": False})
    assert r.render_text(CONV[:2], add_generation_prompt=True).endswith("assistant\n<think>\n\n</think>\n\n")
    out = r.render(CONV)
    assert masked_spans(tok, out) == ["Hi there.<|im_end|>", "Two plus two is four.<|im_end|>"]
    assert unmasked_text(tok, out).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_truncate_and_preformatted(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer, stop_ids=stop_token_ids(tiny_tokenizer))
    out = r.render(CONV)
    cut = out.truncate(out.prompt_length + 2)
    assert cut.truncated and cut.num_tokens == out.prompt_length + 2
    assert cut.loss_mask.tolist() == out.loss_mask[: out.prompt_length + 2].tolist()
    assert out.truncate(10_000) is out
    text = r.render_preformatted("plain text to learn from")
    assert not text.loss_mask[0] and text.loss_mask[1:].all() and text.prompt_length == 1


def test_errors(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer, stop_ids=stop_token_ids(tiny_tokenizer))
    with pytest.raises(InputError, match="no assistant turn"):
        r.render([{"role": "user", "content": "x"}])
    # a template that renders the history differently once a reply follows is refused
    tok = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    tok.chat_template = ("{% for m in messages %}{{ m['role'] + ':' + m['content'] + '|' }}{% endfor %}"
                         "{% if add_generation_prompt %}GEN{% else %}DONE{% endif %}")
    with pytest.raises(ModelError, match="not prefix-stable"):
        ChatRenderer(tok, stop_ids=stop_token_ids(tok)).render(CONV)
    tok.chat_template = None
    with pytest.raises(ModelError, match="no chat template"):
        ChatRenderer(tok, stop_ids=stop_token_ids(tok)).render(CONV)

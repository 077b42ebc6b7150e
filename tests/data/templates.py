"""Chat templates written for the builder's golden tests, attached to locally trained tokenizers.

``LLAMA3_TEMPLATE`` follows the Llama-3 instruct layout (``<|begin_of_text|>``, role headers,
``<|eot_id|>`` closing every turn, no trailing newline); ``QWEN3_TEMPLATE`` follows Qwen3's
ChatML-with-thinking layout: the reasoning of assistant turns after the last user message is
rendered in a ``<think>`` block, earlier turns lose it, and ``enable_thinking=False`` puts an
empty think block into the generation prompt. Both are written here from the published
layouts, not copied.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.tiny import make_tiny_tokenizer

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)

QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'user' or m['role'] == 'system' %}"
    "{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{%- elif m['role'] == 'assistant' %}"
    "{%- set content = m['content'] %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)


def make_llama3_tokenizer(out_dir: str | Path):
    """Tiny BPE with Llama-3 special tokens, ``<|eot_id|>`` as eos and the Llama-3 template."""
    from transformers import PreTrainedTokenizerFast

    tok = make_tiny_tokenizer(out_dir)
    tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    tok.bos_token = "<|begin_of_text|>"
    tok.eos_token = "<|eot_id|>"
    tok.chat_template = LLAMA3_TEMPLATE
    tok.save_pretrained(out_dir)
    return PreTrainedTokenizerFast.from_pretrained(out_dir)


def make_qwen3_tokenizer(out_dir: str | Path):
    """Tiny BPE with ChatML specials plus ``<think>``/``</think>`` and the Qwen3 template."""
    from transformers import PreTrainedTokenizerFast

    tok = make_tiny_tokenizer(out_dir)
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = QWEN3_TEMPLATE
    tok.save_pretrained(out_dir)
    return PreTrainedTokenizerFast.from_pretrained(out_dir)

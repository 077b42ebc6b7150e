"""Tiny, locally built tokenizers and random HF models for fast CPU tests (no hub access).

The tokenizer is a byte-level BPE trained in-process on a few hundred words, so it has real
merges, real ``Ġ`` markers and a real ChatML chat template; the models are random
``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` instances saved with ``save_pretrained`` so that
code under test loads them exactly as it would load a real checkpoint.
"""

from __future__ import annotations

from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is two plus two? Two plus two is four.",
    "def add(a, b):\n    return a + b\n",
    "Stocks rose sharply after the earnings report beat expectations.",
    "If it rains, the ground gets wet; the ground is wet, so maybe it rained.",
    "Hello! How are you today? I am fine, thank you for asking.",
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "1 2 3 4 5 6 7 8 9 10 11 12 100 1000 3.14 = + - * / ( ) [ ] { } : ; , . ! ?",
]


def make_tiny_tokenizer(out_dir: str | Path, *, vocab_size: int = 384, corpus: list[str] | None = None):
    """Train a byte-level BPE tokenizer with ChatML specials and save it to ``out_dir``.

    Returns the loaded ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = (corpus or _CORPUS) * 20
    tok.train_from_iterator(text, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)
    return PreTrainedTokenizerFast.from_pretrained(out_dir)


def _save_model(model, tokenizer, out_dir: Path) -> Path:
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def make_tiny_llama(out_dir: str | Path, tokenizer, *, num_layers: int = 6, hidden_size: int = 64,
                    seed: int = 0, tie_word_embeddings: bool = False) -> Path:
    """Save a random Llama with ``tokenizer``'s vocabulary to ``out_dir`` and return the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return _save_model(LlamaForCausalLM(config).eval(), tokenizer, Path(out_dir))


def make_tiny_qwen3(out_dir: str | Path, tokenizer, *, num_layers: int = 6, hidden_size: int = 64,
                    seed: int = 0) -> Path:
    """Save a random Qwen3 (q/k norms) with ``tokenizer``'s vocabulary to ``out_dir``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return _save_model(Qwen3ForCausalLM(config).eval(), tokenizer, Path(out_dir))

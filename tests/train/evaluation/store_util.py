"""Tiny stores and drafters for the distill/evaluation tests.

``make_store(..., use_builder=True)`` uses the BUILDER helper's ``make_tiny_store`` (the real
builder). ``use_builder=False`` writes the store directly with ``StoreWriter`` from a greedy
``generate`` + ``output_hidden_states`` pass, keeping the generated token ids as they are: the
builder decodes responses to text and re-tokenizes them, and for random tiny models that text
does not round-trip, so its stored responses are not the target's greedy tokens (top-1 of the
stored distribution rarely equals the next stored token). Tests that need responses a greedy
target really produced (acceptance must be learnable) use the direct writer.
"""

from __future__ import annotations

from pathlib import Path

PROMPT_TEXTS = [
    "What is two plus two?", "Say hello.", "Name a capital city.", "Write a tiny function.",
    "Did the stocks rise?", "Is the ground wet?", "Count to ten.", "Tell me about foxes.",
    "What is the capital of Italy?", "How are you today?", "Explain speculative decoding.",
    "Give me a number.", "What does the dog do?", "Why did it rain?", "Add a and b.",
    "What is Paris?",
]
DOMAINS = ["chat", "math", "code"]


def make_prompts(n: int) -> list[dict]:
    return [{"id": f"p{i}", "domain": DOMAINS[i % len(DOMAINS)], "source": "test",
             "conversations": [{"role": "user", "content": PROMPT_TEXTS[i % len(PROMPT_TEXTS)] + f" #{i}"}]}
            for i in range(n)]


def make_store(out_dir, model_dir, *, num_samples=8, max_new_tokens=16, topk=8,
               final_hidden=False, taps=(2, 3, 4), use_builder=False) -> Path:
    prompts = make_prompts(num_samples)
    if use_builder:
        from tests.helpers.tiny_store import make_tiny_store

        return Path(make_tiny_store(out_dir, model_dir, prompts=prompts, num_samples=num_samples,
                                    max_new_tokens=max_new_tokens, topk=topk, final_hidden=final_hidden))
    return _fallback(Path(out_dir), Path(model_dir), prompts, max_new_tokens, topk, final_hidden, taps)


def _fallback(out_dir, model_dir, prompts, max_new_tokens, topk, final_hidden, taps) -> Path:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from osprey_data.store import SampleRecord, StoreHeader, StoreWriter, TapLayers

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    from osprey_data.build.target import chat_template_hash, identify_target

    header = StoreHeader(
        target=identify_target(model, tok, str(model_dir)),
        taps=TapLayers(layer_ids=tuple(taps)), topk=topk, hidden_codec="bf16",
        has_final_hidden=final_hidden, chat_template_hash=chat_template_hash(tok),
        generation={"regenerate": True, "greedy": True, "temperature": 0.0,
                    "max_new_tokens": max_new_tokens},
        build_fingerprint="test", build_config={}, builder_version="test")
    with StoreWriter(str(out_dir), header) as writer:
        for p in prompts:
            ids = tok.apply_chat_template(p["conversations"], add_generation_prompt=True, tokenize=True)
            if not isinstance(ids, list):
                ids = ids["input_ids"]
            prompt = torch.tensor([ids])
            with torch.no_grad():
                gen = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
                out = model(gen, output_hidden_states=True)
            T = gen.shape[1]
            lp = torch.log_softmax(out.logits[0].float(), -1)
            top = lp.topk(topk, dim=-1)
            mask = np.zeros(T, dtype=bool)
            mask[prompt.shape[1]:] = True
            hidden = torch.stack([out.hidden_states[i][0] for i in taps], dim=1)
            writer.add(SampleRecord(
                sample_id=p["id"], domain=p["domain"], source=p["source"], conversation=p["conversations"],
                token_ids=gen[0].numpy().astype(np.int32), loss_mask=mask, prompt_length=prompt.shape[1],
                finish_reason="stop" if int(gen[0, -1]) == tok.eos_token_id else "length",
                hidden_TLD=hidden.numpy(), topk_ids_TK=top.indices.numpy().astype(np.int32),
                topk_logprobs_TK=top.values.numpy(),
                final_hidden_TD=out.hidden_states[-1][0].numpy() if final_hidden else None))
    return out_dir


def make_drafter_dir(out_dir, *, preset: str = "tiny", seed: int = 0, draft_vocab=None, store=None) -> Path:
    """A randomly initialized drafter folder for the tiny target (d=64; taps of ``store`` if given)."""
    import torch

    from osprey_train.models import DrafterConfig, save_drafter
    from osprey_train.models.io import build_drafter

    torch.manual_seed(seed)
    over = {}
    if store is not None:
        from osprey_data.store import StoreReader

        over["tap_layers"] = {"layer_ids": list(StoreReader(str(store)).header.taps.layer_ids),
                              "convention": "hf_hidden_states"}
    model = build_drafter(DrafterConfig.from_name(preset, **over))
    model.reset_parameters()
    with torch.no_grad():  # non-zero extra QKV columns: the condition matters from step 0
        for name, p in model.named_parameters():
            if p.dim() == 2 and float(p.abs().sum()) == 0.0:
                p.normal_(0.0, 0.02)
    if draft_vocab is not None:
        model.set_draft_vocab(torch.as_tensor(draft_vocab))
    save_drafter(model, out_dir)
    return Path(out_dir)


def quick_distill(drafter, reader, *, steps: int = 40, lr: float = 3e-3, ttt_steps: int = 3):
    """A few plain Adam steps of TTT distillation on the whole (tiny) store; returns the drafter."""
    import torch

    from osprey_train.distill_data.packing import pack_samples
    from osprey_train.ttt.unroll import ttt_loss

    batch = pack_samples([reader.sample(i, as_torch=True) for i in range(len(reader))], 10**6)
    batch.taps_BTLDt = batch.taps_BTLDt.float()
    drafter.train()
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        ttt_loss(drafter, batch, steps=ttt_steps).loss.backward()
        opt.step()
    return drafter.eval()


def make_sharp_llama(out_dir, tokenizer_dir, *, init_range: float = 0.15, seed: int = 0) -> Path:
    """A tiny Llama like ``tests.helpers.tiny.make_tiny_llama`` but with a larger init.

    The standard tiny model's next-token distributions are almost uniform (std-0.02 init), so its
    greedy continuations are arbitrary and a few steps of distillation cannot learn them; a larger
    init makes them peaked and structured, which is what a distillation test needs.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rms_norm_eps=1e-6, initializer_range=init_range, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return Path(out_dir)

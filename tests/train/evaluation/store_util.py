"""Tiny stores and drafters for the distill/evaluation tests.

``make_store`` builds a store with the real builder (``tests.helpers.tiny_store.make_tiny_store``):
it stores the prompt ids fed to the target and the ids the target generated verbatim, so a
greedy store's responses are exactly the target's greedy tokens even on random byte-level
models (acceptance is learnable and the offline walk is exact).
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
               final_hidden=False, taps=(2, 3, 4)) -> Path:
    """A greedy store of ``model_dir``'s own responses, built by the real builder."""
    from tests.helpers.tiny_store import make_tiny_store

    prompts = make_prompts(num_samples)
    return Path(make_tiny_store(out_dir, model_dir, prompts=prompts, num_samples=num_samples,
                                max_new_tokens=max_new_tokens, topk=topk, final_hidden=final_hidden,
                                layers=tuple(taps)))


def make_drafter_dir(out_dir, *, preset: str = "tiny", seed: int = 0, draft_vocab=None, store=None,
                     num_layers: int | None = None) -> Path:
    """A randomly initialized drafter folder for the tiny target (d=64; taps of ``store`` if given)."""
    import torch

    from osprey_train.models import DrafterConfig, save_drafter
    from osprey_train.models.io import build_drafter

    torch.manual_seed(seed)
    over = {}
    if store is not None:
        from osprey_data.store import StoreReader

        over["tap_layers"] = StoreReader(str(store)).header.taps
    if draft_vocab is not None:  # an Osprey preset then gets a reduced draft vocabulary
        over["draft_vocab_size"] = len(draft_vocab)
    if num_layers is not None:
        over["num_layers"] = num_layers
    model = build_drafter(DrafterConfig.from_name(preset, **over))
    model.reset_parameters()
    with torch.no_grad():  # non-zero extra QKV columns: the condition matters from step 0
        for p in model.parameters():
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
    from osprey_train.ttt.loss import VocabMap
    from osprey_train.ttt.unroll import ttt_loss

    batch = pack_samples([reader.sample(i, as_torch=True) for i in range(len(reader))], 10**6)
    batch.taps_BTLDt = batch.taps_BTLDt.float()
    vmap = VocabMap.from_drafter(drafter.draft_to_target, drafter.config.vocab_size)
    drafter.train()
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        ttt_loss(drafter, batch, steps=ttt_steps, vmap=vmap).loss.backward()
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


def make_live_setup(root, target, *, max_new_tokens: int) -> dict:
    """Prompt file and store from ``TINY_PROMPTS`` answered by ``target`` (a plain random byte-level
    model: the store holds its ids verbatim), and an Osprey drafter pruned from it and converted."""
    import json

    from osprey_train.stages.convert import ConvertConfig
    from osprey_train.stages.convert import run as convert
    from osprey_train.stages.prune import PruneConfig
    from osprey_train.stages.prune import run as prune
    from tests.helpers.tiny_store import TINY_PROMPTS, make_tiny_store

    root = Path(root)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in TINY_PROMPTS), encoding="utf-8")
    store = make_tiny_store(root / "store", target, prompts=TINY_PROMPTS, max_new_tokens=max_new_tokens)
    backbone = prune(PruneConfig(source=str(target), layers=2, out=root / "backbone")).out
    drafter = convert(ConvertConfig(backbone=backbone, target=str(target), store=str(store),
                                    out=root / "drafter")).out
    return {"prompts": prompts, "store": store, "drafter": drafter, "target": target, "root": root}


def make_layout_setup(root, tokenizer_dir):
    """A greedy store of a sharp tiny Llama and three drafters for it: ``(reader, {name: drafter})``.

    ``osprey-distilled`` is briefly distilled (drafts both accepted and rejected); ``osprey-random``
    and ``eagle3-random`` are random, so their drafts vary with every input (a short distillation
    collapses them onto a few frequent tokens, which could hide a misplaced token or condition).
    """
    import torch

    from osprey_data.store import StoreReader
    from osprey_train.models import load_drafter

    root = Path(root)
    target = make_sharp_llama(root / "target", tokenizer_dir, init_range=0.6)
    reader = StoreReader(str(make_store(root / "store", target, num_samples=4, max_new_tokens=14)))
    distilled = quick_distill(load_drafter(make_drafter_dir(root / "osprey", seed=3)), reader, steps=10, lr=1e-2)
    osprey = load_drafter(make_drafter_dir(root / "osprey-random", seed=5))
    eagle3 = load_drafter(make_drafter_dir(root / "eagle3", preset="tiny-eagle3", seed=2,
                                           draft_vocab=torch.arange(128) * 3))
    return reader, {"osprey-distilled": distilled, "osprey-random": osprey, "eagle3-random": eagle3}

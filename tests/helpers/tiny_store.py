"""``make_tiny_store``: a real feature store built by the real builder on a tiny HF model.

Used by the distill / evaluation / live / demo tests: it runs ``osprey_data.builder.run`` greedily
(CPU, float32) over a few hand-written prompts (with references, so ``regenerate=False`` works)
and returns the store path. Nothing is downloaded; prompts are written here for the tests.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["make_tiny_store", "TINY_PROMPTS"]

_QUESTIONS = [
    ("math", "What is two plus two?", "Two plus two is four."),
    ("chat", "Hello! How are you today?", "I am fine, thank you for asking."),
    ("code", "def add(a, b):\n    return a + b\nWhat does this do?", "It returns the sum of a and b."),
    ("finance", "Stocks rose sharply after the earnings report. Is this positive?", "Yes, it is positive."),
    ("commonsense", "If it rains, is the ground wet?", "Yes, the ground gets wet."),
    ("chat", "What is the capital of France?", "The capital of France is Paris."),
    ("math", "What is 3 + 4?", "3 + 4 = 7."),
    ("chat", "Tell me about speculative decoding.", "A small model drafts tokens and a large one verifies them."),
]

TINY_PROMPTS: list[dict] = [
    {"id": f"tiny-{i:03d}", "domain": dom, "source": "tiny_store",
     "conversations": [{"role": "user", "content": q}], "reference": a}
    for i, (dom, q, a) in enumerate(_QUESTIONS)
]


def _prompts(num_samples: int) -> list[dict]:
    out = []
    for i in range(num_samples):
        base = TINY_PROMPTS[i % len(TINY_PROMPTS)]
        rec = {**base, "id": f"tiny-{i:03d}"}
        if i >= len(TINY_PROMPTS):  # vary repeats so contents differ too
            rec["conversations"] = [{"role": "user", "content": f"{base['conversations'][0]['content']} ({i})"}]
        out.append(rec)
    return out


def make_tiny_store(out_dir, model_dir, *, prompts: list[dict] | None = None, num_samples: int = 8,
                    max_new_tokens: int = 16, topk: int = 8, hidden_codec: str = "bf16-blosc",
                    final_hidden: bool = False, regenerate: bool = True,
                    layers: tuple[int, ...] | None = None, temperature: float = 0.0, seed: int = 0) -> Path:
    """Build a store at ``out_dir`` from ``model_dir`` (a tiny HF model folder) and return its path.

    Args:
        prompts: records in the builder's input format (default: ``num_samples`` built-in prompts).
        num_samples: how many built-in prompts to use when ``prompts`` is None.
        max_new_tokens, topk, hidden_codec, final_hidden, regenerate: builder settings.
        layers: tap layers (HF ``hidden_states`` ids; default: the builder's default taps).
        temperature, seed: sampling (0 = greedy responses).
    """
    import json

    from osprey_data.builder import BuildConfig

    from osprey_data.builder.runner import run

    out_dir = Path(out_dir)
    records = prompts if prompts is not None else _prompts(num_samples)
    inputs = out_dir.parent / f"{out_dir.name}.inputs.jsonl"
    inputs.parent.mkdir(parents=True, exist_ok=True)
    inputs.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    run(BuildConfig(
        target=str(model_dir), inputs=(str(inputs),), out=str(out_dir), backend="hf",
        regenerate=regenerate, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, topk=topk,
        hidden_codec=hidden_codec, final_hidden=final_hidden, batch_size=4, device="cpu",
        dtype="float32", max_length=512, progress=False, num_workers=1, worker_index=0,
        layers=tuple(layers) if layers is not None else None,
    ))
    return out_dir

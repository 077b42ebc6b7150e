"""``write_tiny_study``: a complete study file on tiny local models (the study runner's test preset).

Two domains of hand-written prompts, a small generic corpus, and three arms (Osprey with Stage-2
pretraining and two seeds, Osprey with distillation-based Stage 2, EAGLE-3), every stage sized to
take well under a second on the tiny 6-layer Llama of ``tests.helpers.tiny``, plus a live run of
the best drafter. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.tiny import _CORPUS

__all__ = ["write_tiny_study", "TINY_STUDY_DOMAINS"]

TINY_STUDY_DOMAINS = {
    "chat": [("Hello! How are you today?", "I am fine, thank you."),
             ("What is the capital of France?", "Paris."),
             ("Tell me about speculative decoding.", "A small model drafts and a large one verifies."),
             ("Hello again, how was your day?", "Fine, thank you for asking."),
             ("What is the capital of Italy?", "Rome.")],
    "math": [("What is two plus two?", "Two plus two is four."),
             ("What is 3 + 4?", "3 + 4 = 7."),
             ("What is 10 + 12?", "10 + 12 = 22."),
             ("What is 1 2 3 4 5 6?", "1 2 3 4 5 6 7 8 9 10."),
             ("What is 100 + 1000?", "100 + 1000 = 1100.")],
}


def _write_prompts(path: Path, domain: str, items: list[tuple[str, str]]) -> Path:
    records = [{"id": f"{domain}-{i}", "domain": domain, "source": "tiny_study",
                "conversations": [{"role": "user", "content": q}], "reference": a} for i, (q, a) in enumerate(items)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_tiny_study(folder: Path, model_dir: Path, *, name: str = "tiny", extra: str = "") -> Path:
    """Write ``folder/tiny.toml`` (+ its prompt and corpus files) and return its path."""
    folder = Path(folder)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for domain, items in TINY_STUDY_DOMAINS.items():
        _write_prompts(folder / "data" / f"{domain}.train.jsonl", domain, items[:4])
        _write_prompts(folder / "data" / f"{domain}.eval.jsonl", domain, items[3:])
    docs = [f"{_CORPUS[i % len(_CORPUS)]} {_CORPUS[(3 * i + 1) % len(_CORPUS)]}" for i in range(60)]
    (folder / "data" / "corpus.jsonl").write_text("".join(json.dumps({"id": i, "text": d}) + "\n"
                                                           for i, d in enumerate(docs)), encoding="utf-8")
    text = f'''
[study]
name = "{name}"
description = "Tiny models, two domains: the study runner end to end."
threads = 1

[target]
model = "{model_dir}"

[corpus]
files = ["data/corpus.jsonl"]

[stores]
max_new_tokens = 8
topk = 8
max_length = 256
batch_size = 4
shard_max_tokens = 64

[[domains]]
name = "chat"
train = "data/chat.train.jsonl"
eval = "data/chat.eval.jsonl"
train_samples = 4
eval_samples = 2

[[domains]]
name = "math"
train = "data/math.train.jsonl"
eval = "data/math.eval.jsonl"
train_samples = 4
eval_samples = 2

[prune]
layers = 2

[pretrain]
steps = 2
seq_len = 16
batch_size = 2
lr = 3e-3
eval_every = 1
eval_windows = 2
heldout_fraction = 0.1
save_every = 1

[distill]
steps = 2
tokens_per_batch = 64
lr = 3e-3
ttt_steps = 2
draft_vocab = 128
eval_every = 1   # two held-out points per run: the report measures the late gain
eval_samples = 2
save_every = 1

[eval]
draft_steps = 3

[[arms]]
name = "osprey"
arch = "osprey"
stage2 = "plain"
seeds = [0, 1]

[[arms]]
name = "eagle3"
arch = "eagle3"
stage2 = "none"

[[arms]]
name = "osprey-kd"
arch = "osprey"
stage2 = "kd"

[live]
arm = "best"
prompts = 2
max_new_tokens = 6

[report.roles]
osprey = "osprey"
eagle3 = "eagle3"
osprey_kd = "osprey-kd"
{extra}
'''
    path = folder / "tiny.toml"
    path.write_text(text, encoding="utf-8")
    return path

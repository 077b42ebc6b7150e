"""The whole pipeline on CUDA (tiny local models): builder, prune, convert, distill with bf16
autocast, offline acceptance and live speculative decoding on the GPU, lossless."""

from __future__ import annotations

import json

import pytest

from osprey_train.demo.config import DemoConfig
from osprey_train.demo.pipeline import run


@pytest.mark.gpu
def test_demo_pipeline_on_cuda(tmp_path, tiny_llama_dir):
    cfg = DemoConfig(out=tmp_path / "demo", quick=True, target=str(tiny_llama_dir), source=str(tiny_llama_dir),
                     train_prompts=5, eval_prompts=5, max_new_tokens=8, prune_layers=2, distill_steps=3,
                     tokens_per_batch=128, ttt_steps=2, draft_steps=2, device="cuda", progress=False)
    run(cfg)
    doc = json.loads((tmp_path / "demo" / "demo.json").read_text(encoding="utf-8"))
    live, offline = doc["live"], doc["offline"]
    # speculative decoding on the GPU is lossless: every output equals plain greedy decoding
    assert live["num_prompts"] == 5 and live["greedy_identical"] == 5
    assert live["acceptance_length"] >= 1.0 and offline["distilled"]["overall"] >= 1.0
    assert doc["distill"]["steps"] == 3

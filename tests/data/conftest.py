"""Fixtures of the data tests: Llama-3 / Qwen3 template tokenizers and small conversation files."""

from __future__ import annotations

import json

import pytest

from tests.data.templates import make_llama3_tokenizer, make_qwen3_tokenizer


@pytest.fixture(scope="session")
def llama3_tokenizer(tmp_path_factory):
    return make_llama3_tokenizer(tmp_path_factory.mktemp("llama3_tok"))


@pytest.fixture(scope="session")
def qwen3_tokenizer(tmp_path_factory):
    return make_qwen3_tokenizer(tmp_path_factory.mktemp("qwen3_tok"))


PROMPTS = [
    {"id": "p0", "domain": "math", "source": "t", "conversations": [
        {"role": "user", "content": "What is two plus two?"}], "reference": "Two plus two is four."},
    {"id": "p1", "domain": "chat", "source": "t", "conversations": [
        {"role": "user", "content": "Hello! How are you today?"},
        {"role": "assistant", "content": "I am fine, thank you."},
        {"role": "user", "content": "What is the capital of France?"}], "reference": "Paris."},
    {"id": "p2", "domain": "code", "source": "t", "conversations": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "def add(a, b):\n    return a + b\nExplain."}], "reference": "It adds."},
    {"id": "p3", "domain": "chat", "source": "t", "conversations": [
        {"role": "user", "content": "Tell me about speculative decoding."}], "reference": "Draft and verify."},
    {"id": "p4", "domain": "finance", "source": "t", "conversations": [
        {"role": "user", "content": "Stocks rose sharply after the earnings report. Good?"}], "reference": "Yes."},
    {"id": "p5", "domain": "commonsense", "source": "t", "conversations": [
        {"role": "user", "content": "If it rains, is the ground wet?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Why?"}], "reference": "Water falls on it."},
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture()
def prompts_file(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)

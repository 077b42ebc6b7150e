"""Prompts for live decoding: conversations read and rendered as the builder does, round-robin limits.

Prompts are read and rendered with :mod:`osprey_data.conversation`, as the builder does, so a
store built from the same file with ``osprey data build`` holds exactly the same prompt ids
(that is what the offline/live agreement test relies on). The prompt is the conversation up to
its last user turn; ``limit`` keeps at most that many prompts, taken round-robin across domains
so that every domain stays represented.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from osprey_data.conversation import ChatRenderer, InputSample, iter_inputs
from osprey_data.errors import InputError

__all__ = ["LivePrompt", "load_prompts", "check_prompt_sample"]


@dataclass
class LivePrompt:
    """One prompt ready for decoding."""

    sample_id: str
    domain: str
    prompt_ids: list[int]



def check_prompt_sample(sample: InputSample) -> None:
    """Raise :class:`InputError` unless ``sample`` can be a live prompt (needs no tokenizer, so it
    runs before any model loads too)."""
    if sample.is_text:
        raise InputError(f"{sample.file}:{sample.line}: sample {sample.sample_id!r} is pre-formatted 'text'; live "
                         f"decoding needs a conversation (or 'prompt') ending in a user turn")


def load_prompts(inputs: tuple[str, ...] | list[str], tokenizer: Any, *, limit: int | None = None,
                 samples: list[InputSample] | None = None,
                 template_kwargs: dict[str, Any] | None = None) -> list[LivePrompt]:
    """Read prompt files (or take ``samples`` already read from them) and render each
    conversation up to its last user turn (``template_kwargs``: extra chat-template variables)."""
    renderer = ChatRenderer(tokenizer, stop_ids=frozenset({-1}),  # stop ids unused for prompts
                            template_kwargs=template_kwargs)
    by_domain: dict[str, list[LivePrompt]] = defaultdict(list)
    order: list[str] = []
    for sample in (samples if samples is not None else iter_inputs(list(inputs))):
        where = f"{sample.file}:{sample.line}"
        check_prompt_sample(sample)
        users = [i for i, m in enumerate(sample.conversation) if m["role"] == "user"]
        conversation = sample.conversation[: users[-1] + 1]
        try:
            ids = renderer.generation_prompt_ids(conversation)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        if len(ids) < 2:
            raise InputError(f"{where}: prompt renders to {len(ids)} token(s); need at least 2")
        if sample.domain not in by_domain:
            order.append(sample.domain)
        by_domain[sample.domain].append(LivePrompt(sample.sample_id, sample.domain, ids))
    prompts: list[LivePrompt] = []
    cursor = 0
    total = sum(len(v) for v in by_domain.values())
    if total == 0:
        raise InputError(f"no prompts in {list(inputs)}")
    want = total if limit is None else min(limit, total)
    while len(prompts) < want:  # round-robin keeps every domain represented under --limit
        for domain in order:
            if cursor < len(by_domain[domain]) and len(prompts) < want:
                prompts.append(by_domain[domain][cursor])
        cursor += 1
    return prompts

"""A read-only store view cut to the tokens the target actually generated.

The builder stores each sample as the conversation re-rendered with the chat template, so after
the response it also holds the template's closing tokens (ChatML: ``<|im_end|>`` and a newline),
even when generation stopped at ``max_new_tokens`` without producing an end-of-turn token. Live
decoding never emits those, so offline acceptance on the raw store counts a few extra tokens per
sample. This view ends every response at its first stop token (inclusive) or after
``max_new_tokens`` tokens, which is exactly the sequence greedy decoding emits — the like-for-like
offline counterpart of ``osprey eval live`` (used by the demo and the offline/live test).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

__all__ = ["GeneratedSpanView"]


class GeneratedSpanView:
    """Wraps a :class:`~osprey_data.store.StoreReader`; ``sample(i)`` returns cut samples."""

    def __init__(self, reader: Any, stop_ids: Iterable[int], max_new_tokens: int | None = None) -> None:
        self.reader = reader
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        gen = dict(reader.header.generation or {})
        self.max_new_tokens = int(max_new_tokens if max_new_tokens is not None else gen.get("max_new_tokens", 1 << 30))
        self.header = reader.header
        self.url = getattr(reader, "url", None)

    def __len__(self) -> int:
        return len(self.reader)

    def generated_length(self, token_ids: Any, prompt_length: int) -> int:
        """Number of generated response tokens in a stored sequence."""
        response = [int(t) for t in token_ids[prompt_length:]]
        for i, token in enumerate(response):
            if token in self.stop_ids:
                return min(i + 1, self.max_new_tokens)
        return min(len(response), self.max_new_tokens)

    def sample(self, i: int, *, as_torch: bool = False) -> Any:
        s = self.reader.sample(i, as_torch=as_torch)
        end = s.prompt_length + self.generated_length(s.token_ids, s.prompt_length)
        cut = {"token_ids": s.token_ids[:end], "loss_mask": s.loss_mask[:end], "hidden_TLD": s.hidden_TLD[:end],
               "topk_ids_TK": s.topk_ids_TK[:end], "topk_logprobs_TK": s.topk_logprobs_TK[:end]}
        if s.final_hidden_TD is not None:
            cut["final_hidden_TD"] = s.final_hidden_TD[:end]
        return dataclasses.replace(s, **cut)

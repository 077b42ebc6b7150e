"""Per-sample records: what the builder hands the writer, and what the reader hands back.

Legend: T tokens of one sample, L taps, D target hidden size, K top-k.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from osprey_data.errors import InputError

__all__ = ["SampleRecord", "Sample", "check_record"]


@dataclass(kw_only=True)
class SampleRecord:
    """One sample as produced by the builder (see docs/store.md)."""

    sample_id: str
    domain: str
    source: str
    conversation: list[dict]
    token_ids: np.ndarray
    loss_mask: np.ndarray
    prompt_length: int
    finish_reason: str
    hidden_TLD: Any
    topk_ids_TK: np.ndarray
    topk_logprobs_TK: np.ndarray
    final_hidden_TD: Any = None


@dataclass(kw_only=True)
class Sample:
    """One decoded sample read back from a store.

    numpy mode: token_ids int32 (T,), loss_mask bool (T,), hidden_TLD float32 (T, L, D),
    topk_ids_TK int32, topk_logprobs_TK float32, final_hidden_TD float32 or None.
    torch mode (``as_torch=True``): the same as tensors, hidden states in bfloat16 (the store
    never holds more than bf16 precision, so this is exact for ``bf16`` stores).
    """

    sample_id: str
    domain: str
    source: str
    conversation: list[dict]
    token_ids: Any
    loss_mask: Any
    prompt_length: int
    finish_reason: str
    hidden_TLD: Any
    topk_ids_TK: Any
    topk_logprobs_TK: Any
    final_hidden_TD: Any
    index: int
    shard_id: str

    @property
    def num_tokens(self) -> int:
        return int(len(self.token_ids))


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def _is_finite(x: Any) -> bool:
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return bool(torch.isfinite(x).all())
    except ImportError:  # pragma: no cover
        pass
    return bool(np.isfinite(np.asarray(x, dtype=np.float32)).all())


def check_record(rec: SampleRecord, *, num_taps: int, hidden_size: int, topk: int,
                 vocab_size: int, has_final_hidden: bool) -> None:
    """Raise InputError naming the sample when a record does not fit the store's header."""
    sid = rec.sample_id
    if not isinstance(sid, str) or not sid:
        raise InputError(f"sample_id must be a non-empty string, got {sid!r}")

    def bad(msg: str) -> InputError:
        return InputError(f"sample {sid!r}: {msg}")

    tok = np.asarray(rec.token_ids)
    if tok.ndim != 1 or tok.shape[0] == 0 or not np.issubdtype(tok.dtype, np.integer):
        raise bad(f"token_ids must be a non-empty 1-D integer array, got {tok.dtype}{tok.shape}")
    T = tok.shape[0]
    if tok.min() < 0 or tok.max() >= vocab_size:
        raise bad(f"token id out of range [0, {vocab_size}): min {tok.min()}, max {tok.max()}")
    if _shape(np.asarray(rec.loss_mask)) != (T,):
        raise bad(f"loss_mask shape {np.asarray(rec.loss_mask).shape} != ({T},)")
    if not 0 <= int(rec.prompt_length) <= T:
        raise bad(f"prompt_length {rec.prompt_length} outside [0, {T}]")
    if _shape(rec.hidden_TLD) != (T, num_taps, hidden_size):
        raise bad(f"hidden_TLD shape {_shape(rec.hidden_TLD)} != (T={T}, L={num_taps}, D={hidden_size})")
    if not _is_finite(rec.hidden_TLD):
        raise bad("hidden_TLD contains NaN or Inf")
    ids = np.asarray(rec.topk_ids_TK)
    if _shape(ids) != (T, topk) or not np.issubdtype(ids.dtype, np.integer):
        raise bad(f"topk_ids_TK must be integer (T={T}, K={topk}), got {ids.dtype}{ids.shape}")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise bad(f"topk id out of range [0, {vocab_size})")
    lp = np.asarray(rec.topk_logprobs_TK)
    if _shape(lp) != (T, topk):
        raise bad(f"topk_logprobs_TK shape {lp.shape} != ({T}, {topk})")
    if not np.isfinite(lp).all():
        raise bad("topk_logprobs_TK contains NaN or Inf")
    if (lp > 1e-4).any():
        raise bad("topk_logprobs_TK must be log-probabilities (<= 0)")
    if has_final_hidden:
        if rec.final_hidden_TD is None or _shape(rec.final_hidden_TD) != (T, hidden_size):
            got = None if rec.final_hidden_TD is None else _shape(rec.final_hidden_TD)
            raise bad(f"store has final_hidden: final_hidden_TD must be (T={T}, D={hidden_size}), got {got}")
        if not _is_finite(rec.final_hidden_TD):
            raise bad("final_hidden_TD contains NaN or Inf")
    elif rec.final_hidden_TD is not None:
        raise bad("final_hidden_TD given but the store header says has_final_hidden=False")
    try:
        json.dumps(rec.conversation)
    except (TypeError, ValueError) as exc:
        raise bad(f"conversation is not JSON-serialisable: {exc}") from None

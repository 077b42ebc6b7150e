"""From backend features to store records: finiteness check and the :class:`SampleRecord`.

Backends return per-sequence :class:`~osprey_data.builder.backends.base.SequenceFeatures`
(tapped hidden states, top-k next-token log-probs under the full softmax, optional final hidden
state). Here they meet the rendered tokens: shapes are checked against the sequence, and a
sample whose features contain NaN/Inf is reported (it goes to the errors file, never into the
store) instead of being written.

Legend: T tokens, L taps, D hidden, K top-k.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from osprey_data.builder.backends.base import SequenceFeatures
from osprey_data.conversation.chat_template import RenderedSample
from osprey_data.errors import ModelError
from osprey_data.store import SampleRecord

__all__ = ["non_finite_reason", "make_record"]


def _finite(x: Any) -> bool:
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return bool(torch.isfinite(x).all())
    except ImportError:  # pragma: no cover - torch is a core dependency
        pass
    return bool(np.isfinite(np.asarray(x, dtype=np.float32)).all())


def non_finite_reason(features: SequenceFeatures) -> str | None:
    """Why ``features`` cannot be stored (names the arrays holding NaN/Inf), or None."""
    bad = [name for name, value in (("hidden", features.hidden_TLD),
                                    ("topk_logprobs", features.topk_logprobs_TK),
                                    ("final_hidden", features.final_hidden_TD))
           if value is not None and not _finite(value)]
    return f"non-finite target features (NaN/Inf in {', '.join(bad)})" if bad else None


def make_record(*, sample_id: str, domain: str, source: str, conversation: list[dict],
                rendered: RenderedSample, features: SequenceFeatures, finish_reason: str):
    """Assemble the store record of one sample (checks that features match its length)."""
    T = rendered.num_tokens
    for name, value in (("hidden_TLD", features.hidden_TLD), ("topk_ids_TK", features.topk_ids_TK),
                        ("topk_logprobs_TK", features.topk_logprobs_TK)):
        if int(value.shape[0]) != T:
            raise ModelError(f"sample {sample_id!r}: backend returned {name} for {value.shape[0]} "
                             f"tokens, the sequence has {T}")
    return SampleRecord(
        sample_id=sample_id,
        domain=domain,
        source=source,
        conversation=conversation,
        token_ids=rendered.token_ids.astype(np.int32, copy=False),
        loss_mask=rendered.loss_mask.astype(bool, copy=False),
        prompt_length=int(rendered.prompt_length),
        finish_reason=finish_reason,
        hidden_TLD=features.hidden_TLD,
        topk_ids_TK=np.ascontiguousarray(features.topk_ids_TK, dtype=np.int32),
        topk_logprobs_TK=np.ascontiguousarray(features.topk_logprobs_TK, dtype=np.float32),
        final_hidden_TD=features.final_hidden_TD,
    )

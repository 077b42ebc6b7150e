"""Stub drafters with fixed logits and tiny models, for exact tests of the live harness."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from osprey_train.evaluation.verify import probs_from_logits, sample_from


class LogitsFnDrafter:
    """Drafts by chaining ``logits_fn(context_ids) -> logits_V`` (any fixed function).

    Records the taps it receives so tests can check the harness's bookkeeping.
    """

    def __init__(self, logits_fn: Callable[[list[int]], torch.Tensor]) -> None:
        self.logits_fn = logits_fn
        self.received_taps: list[torch.Tensor] = []
        self.calls = 0

    def reset(self) -> None:
        self.received_taps = []

    def propose(self, ids: Sequence[int], new_taps_TLDt: torch.Tensor, num_steps: int, temperature: float,
                generator: torch.Generator | None):
        self.calls += 1
        self.last_ids_len = len(ids)
        self.received_taps.append(new_taps_TLDt)
        context = list(ids)
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        for _ in range(num_steps):
            logits_V = self.logits_fn(context)
            if temperature <= 0:
                token = int(logits_V.argmax())
            else:
                probs_V = probs_from_logits(logits_V, temperature)
                rows.append(probs_V)
                token = sample_from(probs_V, generator)
            drafts.append(token)
            context.append(token)
        probs = torch.stack(rows) if rows else None
        return drafts, probs


def oracle_drafter(reference: Sequence[int], prompt_len: int, vocab: int) -> LogitsFnDrafter:
    """Proposes exactly ``reference`` (the plain greedy continuation): every draft is accepted."""

    def fn(context: list[int]) -> torch.Tensor:
        k = len(context) - prompt_len
        logits = torch.zeros(vocab)
        logits[reference[k] if k < len(reference) else 0] = 5.0
        return logits

    return LogitsFnDrafter(fn)


def hashed_drafter(vocab: int, seed: int, scale: float = 3.0) -> LogitsFnDrafter:
    """Fixed pseudo-random logits that depend on the last two context tokens."""

    def fn(context: list[int]) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + context[-1] * 131 + (context[-2] if len(context) > 1 else 7))
        return torch.randn(vocab, generator=g) * scale

    return LogitsFnDrafter(fn)


def make_small_vocab_llama(vocab: int = 5, seed: int = 0, logit_scale: float = 4.0):
    """A 2-layer Llama over a tiny vocabulary, peaked enough for distribution tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z=3.09: alpha = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_stat(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic over cells with expected count >= 5 (others pooled into one cell)."""
    n = float(counts.sum())
    expected = probs.double() * n
    big = expected >= 5
    obs = torch.cat([counts.double()[big], counts.double()[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, int(keep.sum()) - 1

"""Attention that gives a verify forward's rows exactly what plain one-row decode steps give them.

Why: greedy speculative decoding is lossless only if the verify forward (S + 1 query rows) gives
each position the logits that a plain decode step (one query row) gives it. The linears are
row-invariant here (prepacked oneDNN weights; float32 accumulation per output), but SDPA is not:
transformers packs the GQA heads of a single query into one call without a mask, while a block of
rows goes through a masked call with repeated K/V, and the CPU flash kernel blocks them
differently. Measured on SmolLM2 in bfloat16: 0 of 96 verify rows had logits bit-equal to the
plain step's (largest gap 0.875); at exact bf16 ties of the top two logits (common: the spacing
is 0.125 at |logit| 16-32) that flips the greedy token, and 4 of 10 speculative outputs split
from plain bf16 decoding (docs/live.md, "Losslessness per precision").

What: a query block of at most :data:`MAX_EXACT_ROWS` rows with a past, in which every row sees
a prefix of the keys (a chain verify, or a tree whose mask happens to be a chain), is computed
one row at a time, each row as the one-row SDPA call plain decoding makes: its own query heads
packed per key/value head (GQA), the keys and values of its visible prefix (a view of the same
cache), no mask. A plain step goes through the same call, so both paths make identical calls on
identical inputs: the same bits. Measured cost (300 interleaved forwards of SmolLM2 in bf16): a
one-row step 0.96x and a 4-row verify 0.99x SDPA's time. Blocks that are not prefix-shaped (real
tree masks, padded batches), longer blocks and blocks with no past (a prompt's prefill, the same
call in both paths anyway) go to SDPA unchanged. The mask builder is SDPA's, so a tree verify's
custom 4D mask arrives as given.

Legend: B batch, H query heads, Hk key/value heads, T query rows, K key positions, D head dim.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["MAX_EXACT_ROWS", "ROW_EXACT", "prefix_lengths", "row_exact_attention", "use_row_exact_attention"]

ROW_EXACT = "osprey_row_exact"
"""The attention implementation's name in transformers' ``AttentionInterface``."""
MAX_EXACT_ROWS = 64
"""Query blocks up to this many rows are computed row by row (a verify of S + 1, a chain-shaped tree)."""


def prefix_lengths(attention_mask: torch.Tensor | None, rows: int, keys: int, causal: bool) -> list[int] | None:
    """How many leading keys each query row sees, or None when some row's visible set is not a
    prefix or differs between batch rows / heads (then the block cannot be split by rows)."""
    if attention_mask is None:
        return [keys - rows + t + 1 for t in range(rows)] if causal else [keys] * rows
    mask = attention_mask[..., :keys]
    if mask.dtype != torch.bool:
        # an additive mask must be a pure visibility mask (0 or "minus infinity"), not finite biases
        if not bool(((mask == 0) | (mask <= torch.finfo(mask.dtype).min / 2)).all()):
            return None
        mask = mask == 0
    visible_NTK = mask.reshape(-1, rows, keys)
    if visible_NTK.shape[0] > 1 and not bool((visible_NTK == visible_NTK[:1]).all()):
        return None
    visible_TK = visible_NTK[0]
    lengths_T = visible_TK.sum(-1)
    positions_K = torch.arange(keys, device=visible_TK.device)
    if not torch.equal(visible_TK, positions_K[None, :] < lengths_T[:, None]):
        return None
    return [int(n) for n in lengths_T.tolist()]


_last_analysis: list = [None, None]  # [key, lengths]: every layer of one forward gets the same mask object


def _cached_prefix_lengths(attention_mask: torch.Tensor | None, rows: int, keys: int,
                           causal: bool) -> list[int] | None:
    if attention_mask is None:
        return prefix_lengths(None, rows, keys, causal)
    key = (attention_mask, attention_mask._version, rows, keys, causal)
    last_key = _last_analysis[0]
    if last_key is not None and last_key[0] is attention_mask and last_key[1:] == key[1:]:
        return _last_analysis[1]
    lengths = prefix_lengths(attention_mask, rows, keys, causal)
    _last_analysis[:] = [key, lengths]
    return lengths


def row_exact_attention(module: Any, query_BHTD: torch.Tensor, key_BHkKD: torch.Tensor, value_BHkKD: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature; returns ``(B, T, H, D)`` output and no weights."""
    rows, keys = query_BHTD.shape[2], key_BHkKD.shape[2]
    # a block with no past (a prompt's prefill) is the same call in plain and speculative decoding
    row_splittable = rows <= MAX_EXACT_ROWS and keys > rows and not dropout and not kwargs.get("softcap") \
        and kwargs.get("position_bias") is None and kwargs.get("s_aux") is None
    if row_splittable and rows == 1 and attention_mask is None:
        return _one_row(query_BHTD, key_BHkKD, value_BHkKD, 0, keys, scaling), None  # a plain decode step
    lengths = None
    if row_splittable:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        lengths = _cached_prefix_lengths(attention_mask, rows, keys, causal)
    if lengths is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query_BHTD, key_BHkKD, value_BHkKD, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    outs_B1HD = [_one_row(query_BHTD, key_BHkKD, value_BHkKD, t, n, scaling) for t, n in enumerate(lengths)]
    return (outs_B1HD[0] if rows == 1 else torch.cat(outs_B1HD, dim=1)), None


def _one_row(query_BHTD: torch.Tensor, key_BHkKD: torch.Tensor, value_BHkKD: torch.Tensor, row: int, keys: int,
             scaling: float | None) -> torch.Tensor:
    """Query row ``row`` over the first ``keys`` keys, unmasked: the one call plain decoding makes."""
    batch, heads, _, dim = query_BHTD.shape
    kv_heads = key_BHkKD.shape[1]
    # the query heads sharing a key/value head are the rows of one call (GQA packing)
    q_BHkGD = query_BHTD[:, :, row].reshape(batch, kv_heads, heads // kv_heads, dim)
    out_BHkGD = torch.nn.functional.scaled_dot_product_attention(
        q_BHkGD, key_BHkKD[:, :, :keys], value_BHkKD[:, :, :keys], scale=scaling)
    return out_BHkGD.reshape(batch, 1, heads, dim)


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ROW_EXACT, row_exact_attention)
    AttentionMaskInterface.register(ROW_EXACT, sdpa_mask)


def use_row_exact_attention(model: Any) -> bool:
    """Switch a transformers model that runs SDPA to :func:`row_exact_attention`; returns False,
    changing nothing, for a model whose attention is not dispatched by name (a drafter) or that
    runs another kernel (eager, flash attention)."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == ROW_EXACT:
        return True
    if impl != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    _register()
    model.set_attn_implementation(ROW_EXACT)
    return getattr(model.config, "_attn_implementation", None) == ROW_EXACT

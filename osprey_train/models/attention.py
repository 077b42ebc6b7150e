"""Attention backends: how a drafter layer's rotated q/k/v become the attention output.

The decoder layers compute q/k/v (with rotary applied) and hand them to an ``AttentionBackend``;
the backend decides what each query may see. This keeps one model implementation for packed
training (``CausalAttention`` with document ids), incremental decoding with rollback
(``KVCacheAttention``) and whatever the trainer needs for Training-Time Test (any object with the
same call signature).

Legend: B batch, H query heads, Hk key/value heads, T new tokens, S cached tokens, d head dim.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from osprey_data.errors import ConfigError

__all__ = ["AttentionBackend", "CausalAttention", "KVCacheAttention", "repeat_kv", "masked_attention"]


@runtime_checkable
class AttentionBackend(Protocol):
    """Computes attention for one layer; rope is already applied; k/v have Hk heads."""

    def __call__(self, layer_idx: int, q_BHTd: torch.Tensor, k_BHkTd: torch.Tensor,
                 v_BHkTd: torch.Tensor) -> torch.Tensor:  # pragma: no cover - protocol
        ...


def repeat_kv(x_BHkTd: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat each key/value head num_heads // Hk times (GQA), keeping head order h -> h // groups."""
    groups = num_heads // x_BHkTd.shape[1]
    if groups == 1:
        return x_BHkTd
    return x_BHkTd.repeat_interleave(groups, dim=1)


def masked_attention(q_BHTd: torch.Tensor, k_BHkSd: torch.Tensor, v_BHkSd: torch.Tensor,
                     allowed_BTS: torch.Tensor) -> torch.Tensor:
    """Softmax attention where ``allowed_BTS`` (bool, True = may attend) masks keys per query.

    Every query must be allowed at least one key (the causal diagonal guarantees it), otherwise
    its row would be NaN.
    """
    num_heads = q_BHTd.shape[1]
    k = repeat_kv(k_BHkSd, num_heads)
    v = repeat_kv(v_BHkSd, num_heads)
    mask_B1TS = allowed_BTS[:, None, :, :]
    return F.scaled_dot_product_attention(q_BHTd, k, v, attn_mask=mask_B1TS,
                                          scale=1.0 / math.sqrt(q_BHTd.shape[-1]))


class CausalAttention:
    """Causal self-attention over the block, with no attention across documents.

    Args:
        doc_ids_BT: optional document id of every token (packed sequences); a query attends only
            to earlier-or-same positions with the same document id. None = one document per row.
    """

    def __init__(self, doc_ids_BT: torch.Tensor | None = None) -> None:
        self.doc_ids_BT = doc_ids_BT
        self._mask_cache: tuple[tuple, torch.Tensor] | None = None

    def mask(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        """The (B, T, T) boolean 'may attend' mask; built once and reused across layers."""
        key = (batch, length, device)
        if self._mask_cache is not None and self._mask_cache[0] == key:
            return self._mask_cache[1]
        allowed_TT = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        allowed_BTT = allowed_TT[None].expand(batch, length, length)
        if self.doc_ids_BT is not None:
            doc = self.doc_ids_BT.to(device)
            if doc.shape != (batch, length):
                raise ConfigError(
                    f"CausalAttention: doc_ids has shape {tuple(doc.shape)}, the batch is {(batch, length)}"
                )
            allowed_BTT = allowed_BTT & (doc[:, :, None] == doc[:, None, :])
        self._mask_cache = (key, allowed_BTT)
        return allowed_BTT

    def __call__(self, layer_idx: int, q_BHTd: torch.Tensor, k_BHkTd: torch.Tensor,
                 v_BHkTd: torch.Tensor) -> torch.Tensor:
        batch, _, length, _ = q_BHTd.shape
        if self.doc_ids_BT is None:
            # Plain causal: let SDPA pick a fused (flash / mem-efficient) kernel, no mask tensor.
            num_heads = q_BHTd.shape[1]
            return F.scaled_dot_product_attention(
                q_BHTd, repeat_kv(k_BHkTd, num_heads), repeat_kv(v_BHkTd, num_heads), is_causal=True,
                scale=1.0 / math.sqrt(q_BHTd.shape[-1]))
        return masked_attention(q_BHTd, k_BHkTd, v_BHkTd, self.mask(batch, length, q_BHTd.device))


class KVCacheAttention:
    """Incremental decoding: each call appends the new k/v of that layer to its cache.

    New queries attend to every cached key plus, causally, the keys of their own block. After
    verification, :meth:`truncate` rolls the cache back to the accepted length. All rows of the
    batch share one cache length.

    Cost per call is independent of how long the sequence already is, apart from the attention
    itself: k/v are written in place into preallocated per-layer buffers (``capacity`` positions,
    grown by doubling) and attention reads a view of the first ``length`` positions; rolling back
    only moves the length (no copy, no free); a single new query needs no mask, a block builds
    its mask once per forward (shared by the layers); GQA heads are not materialised
    (``enable_gqa``).
    """

    def __init__(self, num_layers: int, capacity: int = 0) -> None:
        if num_layers < 1:
            raise ConfigError(f"KVCacheAttention needs num_layers >= 1, got {num_layers}")
        self.num_layers = num_layers
        self.capacity = max(int(capacity), 64)
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._lengths = [0] * num_layers
        self._mask: tuple[tuple, torch.Tensor] | None = None

    @property
    def length(self) -> int:
        """Tokens cached in layer 0 (all layers agree after every full forward)."""
        return self._lengths[0]

    def layer_length(self, layer_idx: int) -> int:
        return self._lengths[layer_idx]

    @property
    def keys(self) -> list[torch.Tensor | None]:
        """Per layer, the cached keys (B, Hk, length, d) as views (None before the first call)."""
        return [None if k is None else k[:, :, :n] for k, n in zip(self._keys, self._lengths)]

    @property
    def values(self) -> list[torch.Tensor | None]:
        """Per layer, the cached values (B, Hk, length, d) as views (None before the first call)."""
        return [None if v is None else v[:, :, :n] for v, n in zip(self._values, self._lengths)]

    def truncate(self, length: int) -> None:
        """Drop cached positions >= length in every layer (reject draft tokens)."""
        if length < 0:
            raise ConfigError(f"KVCacheAttention.truncate: length must be >= 0, got {length}")
        self._lengths = [min(n, length) for n in self._lengths]

    def reset(self) -> None:
        """Empty the cache (the buffers are kept for the next sequence)."""
        self.truncate(0)

    def _reserve(self, layer_idx: int, k_BHkTd: torch.Tensor, v_BHkTd: torch.Tensor, end: int) -> None:
        k = self._keys[layer_idx]
        if k is not None and k.shape[0] == k_BHkTd.shape[0] and k.dtype == k_BHkTd.dtype \
                and k.device == k_BHkTd.device and k.shape[2] >= end:
            return
        past = self._lengths[layer_idx]
        if k is not None and past and k.shape[0] != k_BHkTd.shape[0]:
            raise ConfigError(f"KVCacheAttention: batch changed from {k.shape[0]} to {k_BHkTd.shape[0]} "
                              "with tokens cached; reset() first")
        capacity = max(end, self.capacity, 2 * (k.shape[2] if k is not None else 0))
        for store, new in ((self._keys, k_BHkTd), (self._values, v_BHkTd)):
            old = store[layer_idx]
            buf = new.new_empty((new.shape[0], new.shape[1], capacity, new.shape[-1]))
            if old is not None and past:
                buf[:, :, :past].copy_(old[:, :, :past])
            store[layer_idx] = buf

    def _block_mask(self, past: int, new: int, device: torch.device) -> torch.Tensor:
        """(new, past + new) bool: query i (at position past + i) sees keys 0 .. past + i."""
        key = (past, new, device)
        if self._mask is None or self._mask[0] != key:
            query_pos_T = torch.arange(past, past + new, device=device)
            key_pos_S = torch.arange(past + new, device=device)
            self._mask = (key, key_pos_S[None, :] <= query_pos_T[:, None])
        return self._mask[1]

    def __call__(self, layer_idx: int, q_BHTd: torch.Tensor, k_BHkTd: torch.Tensor,
                 v_BHkTd: torch.Tensor) -> torch.Tensor:
        past = self._lengths[layer_idx]
        new = k_BHkTd.shape[2]
        end = past + new
        self._reserve(layer_idx, k_BHkTd, v_BHkTd, end)
        self._keys[layer_idx][:, :, past:end].copy_(k_BHkTd)
        self._values[layer_idx][:, :, past:end].copy_(v_BHkTd)
        self._lengths[layer_idx] = end
        k_all = self._keys[layer_idx][:, :, :end]
        v_all = self._values[layer_idx][:, :, :end]
        # a single new query sees every cached key: no mask at all
        mask = None if q_BHTd.shape[2] == 1 else self._block_mask(past, new, q_BHTd.device)
        return F.scaled_dot_product_attention(q_BHTd, k_all, v_all, attn_mask=mask,
                                              scale=1.0 / math.sqrt(q_BHTd.shape[-1]),
                                              enable_gqa=q_BHTd.shape[1] != k_all.shape[1])

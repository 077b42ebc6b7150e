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
    """

    def __init__(self, num_layers: int) -> None:
        if num_layers < 1:
            raise ConfigError(f"KVCacheAttention needs num_layers >= 1, got {num_layers}")
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        """Tokens cached in layer 0 (all layers agree after every full forward)."""
        return 0 if self.keys[0] is None else int(self.keys[0].shape[2])

    def layer_length(self, layer_idx: int) -> int:
        k = self.keys[layer_idx]
        return 0 if k is None else int(k.shape[2])

    def truncate(self, length: int) -> None:
        """Drop cached positions >= length in every layer (reject draft tokens)."""
        if length < 0:
            raise ConfigError(f"KVCacheAttention.truncate: length must be >= 0, got {length}")
        for i in range(self.num_layers):
            if self.keys[i] is not None:
                if length == 0:
                    self.keys[i] = self.values[i] = None
                else:
                    self.keys[i] = self.keys[i][:, :, :length]
                    self.values[i] = self.values[i][:, :, :length]

    def reset(self) -> None:
        """Empty the cache."""
        self.truncate(0)

    def __call__(self, layer_idx: int, q_BHTd: torch.Tensor, k_BHkTd: torch.Tensor,
                 v_BHkTd: torch.Tensor) -> torch.Tensor:
        past = self.layer_length(layer_idx)
        if self.keys[layer_idx] is None:
            k_all, v_all = k_BHkTd, v_BHkTd
        else:
            k_all = torch.cat([self.keys[layer_idx], k_BHkTd], dim=2)
            v_all = torch.cat([self.values[layer_idx], v_BHkTd], dim=2)
        self.keys[layer_idx], self.values[layer_idx] = k_all, v_all
        batch, _, new, _ = q_BHTd.shape
        total = past + new
        # Query i sits at absolute position past + i and sees keys 0 .. past + i.
        query_pos_T = torch.arange(past, total, device=q_BHTd.device)
        key_pos_S = torch.arange(total, device=q_BHTd.device)
        allowed_TS = key_pos_S[None, :] <= query_pos_T[:, None]
        return masked_attention(q_BHTd, k_all, v_all, allowed_TS[None].expand(batch, new, total))

"""The target side of live decoding: one HF causal LM with a KV cache that rolls back for free.

:class:`HFTargetSession` feeds token blocks after the cached ones and returns their logits and,
when asked, the drafter's taps. What a speculative round costs on top of the target's own forward
is kept small and independent of the sequence length:

- **cache**: :func:`rollback_cache` is a transformers ``DynamicCache`` whose full-attention layers
  write into preallocated buffers (grown by doubling, so an append is amortised O(new tokens))
  and hand the attention a view of the first ``length`` positions. Rolling back rejected drafts
  (:meth:`HFTargetSession.crop`) only moves that length: nothing is copied or freed. (The stock
  ``DynamicLayer`` concatenates the whole past on every forward: O(length) per step.)
  Sliding-window layers (Gemma-3) keep transformers' own layer with past recording, so they can
  roll back too.
- **taps**: forward hooks on the tapped layers only (:class:`~osprey_data.target_model.TapCapture`),
  not ``output_hidden_states`` (every layer's state kept for every forward).
- **logits**: only for the positions the caller needs (``logits_to_keep``): the last one after
  a prefill or a plain decode step, all ``S + 1`` in a verify forward.
- **attention**: an SDPA target is switched to :mod:`row_exact_attention`, so that a verify
  forward gives each row the bits a plain one-row step gives it (lossless greedy decoding in
  bfloat16, where SDPA's row blocking flips exact logit ties).

Legend: T tokens, L taps, Dt target hidden, V target vocabulary.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch

from osprey_data.errors import ModelError
from osprey_data.target_model import TapCapture, decoder_layers
from osprey_train.evaluation.row_exact_attention import use_row_exact_attention

__all__ = ["HFTargetSession", "rollback_cache"]

_MIN_CAPACITY = 64


@functools.cache
def _buffer_layer_class() -> type:
    """The cache layer class, built on first use (transformers is imported lazily in this package)."""
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        """A full-attention cache layer over preallocated ``(B, H, capacity, d)`` buffers."""

        is_croppable = True

        def __init__(self, capacity: int = 0) -> None:
            super().__init__()
            self.capacity = max(int(capacity), _MIN_CAPACITY)
            self.length = 0
            self._keys = self._values = None

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            batch, heads, _, dim = key_states.shape
            self._keys = key_states.new_empty((batch, heads, self.capacity, dim))
            self._values = value_states.new_empty((batch, value_states.shape[1], self.capacity,
                                                   value_states.shape[-1]))
            self.length = 0
            self.is_initialized = True
            self._expose()

        def _expose(self) -> None:
            self.keys = self._keys[:, :, : self.length]
            self.values = self._values[:, :, : self.length]

        def _grow(self, needed: int) -> None:
            # doubling: each position is copied O(1) times over the whole sequence
            capacity = max(needed, 2 * self._keys.shape[2])
            for name in ("_keys", "_values"):
                old = getattr(self, name)
                new = old.new_empty((*old.shape[:2], capacity, old.shape[-1]))
                new[:, :, : self.length].copy_(old[:, :, : self.length])
                setattr(self, name, new)
            self.capacity = capacity

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self._keys.shape[2]:
                self._grow(end)
            self._keys[:, :, self.length: end].copy_(key_states)
            self._values[:, :, self.length: end].copy_(value_states)
            self.length = end
            self._expose()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def move_rows(self, prefix: int, index: torch.Tensor) -> None:
            """Keep ``prefix`` positions, then the rows ``index`` (>= prefix, ascending) right after them."""
            end = prefix + index.numel()
            for buf in (self._keys, self._values):
                buf[:, :, prefix:end] = buf.index_select(2, index)  # a copy of the few kept rows
            self.length = end
            self._expose()

        def crop(self, tokens_to_remove: int) -> None:
            # transformers >= 5: a negative number of tokens to remove
            if tokens_to_remove > 0:
                raise ValueError(f"crop({tokens_to_remove}): pass minus the number of tokens to remove")
            if tokens_to_remove == 0 or not self.is_initialized:
                return
            self.length = max(0, self.length + tokens_to_remove)
            self._expose()

        def reset(self) -> None:
            self.length = 0
            if self.is_initialized:
                self._expose()

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("the rollback cache holds one sequence")

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            raise NotImplementedError("the rollback cache holds one sequence")

    return BufferLayer


def rollback_cache(model_config: Any, capacity: int = 0) -> Any:
    """A ``DynamicCache`` for ``model_config`` whose full-attention layers roll back by length.

    ``capacity`` is the number of positions to preallocate (more are added by doubling).
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layer_class = _buffer_layer_class()
    cache = DynamicCache(config=model_config)
    if cache.layers:
        cache.layers = [layer_class(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    else:  # no per-layer types known: layers are created on first use
        cache.layer_class_to_replicate = functools.partial(layer_class, capacity)
    for layer in cache.layers:
        # sliding-window layers (Gemma-3) drop old states unless told to keep them for rollback
        if getattr(layer, "is_sliding", False) and hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()
    return cache


class HFTargetSession:
    """A transformers causal LM with a rollback-able KV cache and hidden-state taps."""

    def __init__(self, model: Any, tap_layers: Sequence[int] = (), *, row_exact: bool = True) -> None:
        """``row_exact``: switch an SDPA target to row-exact attention (this changes ``model``'s
        attention implementation for every later caller too; prefills are unaffected)."""
        self.model = model
        self.row_exact = use_row_exact_attention(model) if row_exact else False
        self.tap_layers = tuple(int(i) for i in tap_layers)
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self.length = 0
        self.forwards = 0
        self._layers = decoder_layers(model) if self.tap_layers else None  # plain decoding needs none
        # transformers 5.x renamed ``past_key_values`` to ``cache``; accept both generations
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._logits_kw = "logits_to_keep" if "logits_to_keep" in params else None

    def reset(self, capacity: int = 0) -> None:
        """Start a new sequence; ``capacity`` positions are preallocated in the KV cache."""
        self.cache = rollback_cache(self.model.config, capacity)
        self.length = 0
        self.forwards = 0

    @torch.no_grad()
    def forward(self, ids: Sequence[int], *, want_taps: bool, logits_for: int | None = None,
                positions: Sequence[int] | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``ids`` after the cached ones; return float32 logits and taps (T, L, Dt).

        Logits are ``(logits_for, V)`` for the last ``logits_for`` positions (default: all T).
        ``positions`` (default: consecutive after the cache) and a 4D additive ``attention_mask``
        over the cache and the new tokens serve tree verification (:mod:`tree_verify`).
        """
        num = len(ids)
        input_ids_BT = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        if positions is None:
            position_ids_BT = torch.arange(self.length, self.length + num, device=self.device)[None]
        else:
            position_ids_BT = torch.tensor([list(positions)], dtype=torch.long, device=self.device)
        kwargs: dict[str, Any] = {self._cache_kw: self.cache}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if self._logits_kw is not None and logits_for is not None:
            kwargs[self._logits_kw] = int(logits_for)
        capture = TapCapture(self.model, self.tap_layers, layers=self._layers) if want_taps else None
        if capture is None:
            out = self.model(input_ids=input_ids_BT, position_ids=position_ids_BT, use_cache=True, **kwargs)
        else:
            with capture:
                out = self.model(input_ids=input_ids_BT, position_ids=position_ids_BT, use_cache=True, **kwargs)
        # the cache is updated in place; self.cache stays the live object
        self.length += num
        self.forwards += 1
        logits_TV = out.logits[0]
        if logits_for is not None:
            logits_TV = logits_TV[-int(logits_for):]  # models without logits_to_keep return all rows
        taps_TLDt = capture.stacked(dim=2)[0].float() if capture is not None else None
        return logits_TV.float(), taps_TLDt

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached positions (roll back rejected drafts)."""
        remove = self.length - length
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {length}")
        if remove:
            self.cache.crop(-remove)  # transformers >= 5: negative = number of tokens to remove
            self.length = length

    def keep(self, prefix: int, rows: Sequence[int]) -> None:
        """Keep the first ``prefix`` cached positions, then the cached ``rows`` (ascending, all
        ``>= prefix``) moved into the positions that follow; drop everything else.

        Tree verification keeps the accepted path this way: only those few rows are copied.
        """
        rows = [int(r) for r in rows]
        if any(r < prefix or r >= self.length for r in rows) or rows != sorted(set(rows)):
            raise ValueError(f"keep: rows {rows} must be ascending cached positions >= {prefix} "
                             f"(cache of {self.length})")
        layers = getattr(self.cache, "layers", [])
        if any(getattr(layer, "is_sliding", False) for layer in layers):
            raise ModelError("this target's cache has sliding-window layers, whose entries cannot be moved")
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in layers:
            if isinstance(layer, _buffer_layer_class()):
                layer.move_rows(prefix, index)
            else:  # any other full-attention layer: rebuild its tensors
                keep_all = torch.cat([torch.arange(prefix, device=self.device), index])
                layer.keys = layer.keys.index_select(-2, keep_all)
                layer.values = layer.values.index_select(-2, keep_all)
        self.length = prefix + len(rows)

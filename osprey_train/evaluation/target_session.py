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
- **exact rows**: greedy speculative decoding is lossless only if a verify forward gives each
  row the bits a plain one-row step gives it. An SDPA target is switched to
  :mod:`row_exact_attention`; :meth:`HFTargetSession.make_rows_exact` shapes the linears' calls
  (:mod:`row_exact_linear`) for blocks up to the verify length, then checks the whole model:
  verify blocks of every length against one-row steps on a calibration sequence, bit for bit. If
  a block length still differs (a kernel that neither fix covers), blocks of that length are
  verified one row at a time (each row a plain step: slower, and still exact). The outcome is
  :attr:`HFTargetSession.exactness`, which reports print.

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
from osprey_train.evaluation.row_exact_linear import use_row_exact_linears

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
        self.exactness: dict[str, Any] = {"attention": "row-exact" if self.row_exact else "not row-exact",
                                          "rows_checked": 0}
        self._row_by_row: frozenset[int] = frozenset()  # block lengths verified one row at a time
        self.cache: Any = None
        self.length = 0
        self.forwards = 0
        self._layers = decoder_layers(model) if self.tap_layers else None  # plain decoding needs none
        # transformers 5.x renamed ``past_key_values`` to ``cache``; accept both generations
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._logits_kw = "logits_to_keep" if "logits_to_keep" in params else None

    @torch.no_grad()
    def make_rows_exact(self, max_rows: int, calibration_ids: Sequence[int] | None = None) -> dict[str, Any]:
        """Make verify blocks of up to ``max_rows`` rows compute what one-row steps compute, and
        prove it on this machine; returns :attr:`exactness`.

        Shapes the linears (:func:`use_row_exact_linears`), then feeds a calibration sequence
        (``calibration_ids``, default: spread-out ids of the vocabulary) once as one-row steps and,
        for every length ``2..max_rows``, as one block after the same past, and compares logits and
        taps bit for bit. A length that still differs is verified one row at a time from then on.
        Must run again if the thread count changes (kernels block by it).
        """
        if not self.row_exact:
            raise ModelError("make_rows_exact needs row-exact attention (an SDPA target, row_exact=True)")
        plans = use_row_exact_linears(self.model, max_rows)
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        past = 16
        ids = list(calibration_ids) if calibration_ids is not None else \
            [(7919 * (i + 1)) % vocab for i in range(past + max_rows)]
        if len(ids) < past + max_rows:
            raise ValueError(f"calibration needs {past + max_rows} ids, got {len(ids)}")
        self._row_by_row = frozenset()
        self.reset(capacity=past + max_rows)
        self.forward(ids[:past], want_taps=False, logits_for=1)
        steps = [self.forward([t], want_taps=bool(self.tap_layers)) for t in ids[past: past + max_rows]]
        split = []
        for rows in range(2, max_rows + 1):
            self.crop(past)
            logits_TV, taps_TLDt = self.forward(ids[past: past + rows], want_taps=bool(self.tap_layers))
            same = all(torch.equal(logits_TV[t], steps[t][0][0]) for t in range(rows))
            if self.tap_layers:
                same = same and all(torch.equal(taps_TLDt[t], steps[t][1][0]) for t in range(rows))
            if not same:
                split.append(rows)
        self._row_by_row = frozenset(split)
        self.reset()
        self.exactness = {
            "attention": "row-exact", "rows_checked": max_rows, "threads": torch.get_num_threads(),
            "linears": {kernel: plan.describe() for kernel, plan in plans.items()},
            "row_by_row": sorted(split),
            "summary": (f"verify rows exact by construction, checked for blocks of 1..{max_rows} rows"
                        if not split else
                        f"verify blocks of {sorted(split)} rows computed one row at a time (a kernel here "
                        f"is not row-invariant): exact, not faster than plain steps"),
        }
        return self.exactness

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
        if num in self._row_by_row and positions is None and attention_mask is None:
            return self._forward_row_by_row(ids, want_taps=want_taps, logits_for=logits_for)
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

    def _forward_row_by_row(self, ids: Sequence[int], *, want_taps: bool,
                            logits_for: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A block as one-row steps (each exactly a plain step); same returns as :meth:`forward`."""
        outs = [self.forward([t], want_taps=want_taps) for t in ids]
        self.forwards -= len(ids) - 1  # one verify round, however it was computed
        logits_TV = torch.cat([o[0] for o in outs])
        if logits_for is not None:
            logits_TV = logits_TV[-int(logits_for):]
        taps_TLDt = torch.cat([o[1] for o in outs]) if want_taps else None
        return logits_TV, taps_TLDt

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

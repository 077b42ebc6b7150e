"""Taking a target's tapped hidden states with hooks during an ordinary forward pass.

HF numbering (:class:`~osprey_data.target_model.taps.TapLayers`): tap ``i < L`` is the input of decoder
layer ``i`` (``hidden_states[i]``, 0 = the embeddings), tap ``L`` the final post-norm hidden state.
Rather than asking the model for every layer's state (``output_hidden_states``: ``L + 1`` tensors
kept alive per forward), a forward pre-hook on each tapped layer keeps a reference to that layer's
input, and, only when tap ``L`` is asked for, a forward hook on the base model keeps its last
hidden state. Nothing is copied until :meth:`TapCapture.stacked`.

Used by the builder's HF backend (one prefill of whole sequences) and by live speculative decoding
(every verify forward). The hooks exist only inside the ``with`` block: the model is left as it was.

torch is imported inside the functions (the CLI imports this package on its ``--help`` path).

Legend: T tokens, L taps, D hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from osprey_data.errors import ConfigError, ModelError
from osprey_data.target_model.identity import text_config

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["decoder_layers", "TapCapture"]


def decoder_layers(model: Any) -> "torch.nn.ModuleList":
    """The decoder-layer list of a causal LM (``model.model.layers`` for Llama/Qwen/Gemma)."""
    import torch

    num_layers = int(text_config(model.config).num_hidden_layers)
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) == num_layers:
        return layers
    for module in base.modules():  # other layouts: the one ModuleList of the right length
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return module
    raise ModelError(f"cannot find the {num_layers} decoder layers of {type(model).__name__}")


class TapCapture:
    """``with TapCapture(model, taps) as cap: model(...)``, then ``cap.stacked(dim)``.

    Args:
        model: a transformers causal LM (or its base model, for the decoder layers).
        taps: tap ids in HF numbering, in the order the drafter concatenates them.
        layers: the model's decoder layers, when the caller has already found them.
    """

    def __init__(self, model: Any, taps: Sequence[int], layers: Any = None) -> None:
        self.layers = layers if layers is not None else decoder_layers(model)
        self.num_layers = len(self.layers)
        self.taps = tuple(int(i) for i in taps)
        bad = [i for i in self.taps if not 0 <= i <= self.num_layers]
        if bad:
            raise ConfigError(f"tap ids {list(self.taps)} must be in [0, {self.num_layers}] for this "
                              f"{self.num_layers}-layer target (bad: {bad})")
        self.base = getattr(model, "base_model", None)
        if self.num_layers in self.taps and self.base is None:
            raise ModelError(f"{type(model).__name__} has no base model whose output is tap {self.num_layers}")
        self.captured: dict[int, Any] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> "TapCapture":
        self.captured = {}

        def before(layer_idx: int):
            def hook(_module: Any, args: tuple, kwargs: dict) -> None:
                self.captured[layer_idx] = args[0] if args else kwargs["hidden_states"]
            return hook

        def after(_module: Any, _args: tuple, output: Any) -> None:
            last = getattr(output, "last_hidden_state", None)
            self.captured[self.num_layers] = last if last is not None else output[0]

        try:
            for i in sorted(set(self.taps)):
                if i < self.num_layers:
                    self._handles.append(self.layers[i].register_forward_pre_hook(before(i), with_kwargs=True))
            if self.num_layers in self.taps:
                self._handles.append(self.base.register_forward_hook(after))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._remove()

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def stacked(self, dim: int) -> "torch.Tensor":
        """The captured states stacked in tap order along ``dim`` (e.g. ``(B, T, L, D)`` with dim 2)."""
        import torch

        missing = [i for i in self.taps if i not in self.captured]
        if missing:
            raise ModelError(f"taps {missing} were not captured: the forward pass did not run those layers")
        return torch.stack([self.captured[i] for i in self.taps], dim=dim)

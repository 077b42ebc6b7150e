"""The Osprey drafter: N decoder layers of the source family, each reading the target condition.

Parameter names are the source model's HF names (``model.embed_tokens``, ``model.layers.i.*``,
``model.norm``, ``lm_head``) so that Stage 3 copies tensors 1:1. Additions:

- ``w_c`` (Linear(num_taps * Dt -> D), no bias): W_c, fuses the target taps into the condition c.
- in every layer, ``cond_norm`` (RMSNorm, init 1) normalises c before it enters attention. We
  normalise because c is not always W_c(taps): during Training-Time Test it is the drafter's own
  pre-norm hidden state, whose scale differs; the norm gives the extra columns the same input
  scale either way (EAGLE-3's ``hidden_norm`` does the same).
- in every layer, q/k/v_proj weights are (out, 2D): columns [:D] read z = input_layernorm(x)
  exactly as in the source, columns [D:] read cond_norm(c). Zero extra columns => the layer
  computes exactly what the source layer computed, for any c.
- optionally a reduced draft vocabulary (EAGLE-3's mechanism, ``draft_vocab_size < vocab_size``):
  the LM head keeps only the rows of ``draft_vocab_size`` target tokens and the ``d2t`` buffer
  maps LM-head row -> target id. The embedding stays over the full target vocabulary (drafts are
  fed back as target ids). Without it there is no ``d2t`` and ``draft_to_target`` is None.

Legend: B batch, T tokens, L taps, Dt target hidden, D hidden, V target vocab.
"""

from __future__ import annotations

import torch
from torch import nn

from osprey_train.models.attention import AttentionBackend
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.layers import ConditionedAttention, RMSNorm, RotaryEmbedding, SwiGLUMLP

__all__ = ["OspreyDrafter", "OspreyDecoderLayer"]


class OspreyDecoderLayer(nn.Module):
    """Pre-norm decoder layer of the source family with a conditioned attention."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.cond_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = ConditionedAttention(config, cond_width=config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config)

    def forward(self, layer_idx: int, x_BTD: torch.Tensor, cond_BTD: torch.Tensor,
                cos_sin: tuple[torch.Tensor, torch.Tensor], attention: AttentionBackend) -> torch.Tensor:
        z = self.input_layernorm(x_BTD)
        c = self.cond_norm(cond_BTD)
        x_BTD = x_BTD + self.self_attn(layer_idx, z, c, cos_sin, attention)
        return x_BTD + self.mlp(self.post_attention_layernorm(x_BTD))


class _Body(nn.Module):
    """Holds the HF-named ``model.*`` parameters."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(OspreyDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class OspreyDrafter(Drafter):
    """N conditioned source-family layers over the target vocabulary (or a draft subset of it)."""

    arch = "osprey"

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__(config)
        self.model = _Body(config)
        self.w_c = nn.Linear(config.taps_width, config.hidden_size, bias=False)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        if config.draft_vocab_size < config.vocab_size:
            self._register_draft_vocab()  # reduced draft vocabulary: LM-head row i predicts target d2t[i]
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Random init (HF-style normal(0, std)) of everything, extra q/k/v columns included.

        A random drafter is random everywhere; Stage 3 (convert) copies the backbone and then
        calls :meth:`zero_extra_columns` and :func:`init_w_c` for the function-preserving start.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    @torch.no_grad()
    def zero_extra_columns(self) -> None:
        """Zero the q/k/v column blocks that read the condition, in every layer."""
        for layer in self.model.layers:
            for block in layer.self_attn.extra_columns():
                block.zero_()

    def extra_column_blocks(self) -> list[torch.Tensor]:
        """Views of every layer's q/k/v extra column blocks (for tests and diagnostics)."""
        return [b for layer in self.model.layers for b in layer.self_attn.extra_columns()]

    def taps_projection(self) -> nn.Linear:
        return self.w_c

    def final_norm(self) -> nn.Module:
        return self.model.norm

    def forward_hidden(self, input_ids_BT: torch.Tensor, cond_BTD: torch.Tensor,
                       position_ids_BT: torch.Tensor, attention: AttentionBackend) -> torch.Tensor:
        self._check_inputs(input_ids_BT, cond_BTD, position_ids_BT)
        x_BTD = self.model.embed_tokens(input_ids_BT)
        cond_BTD = cond_BTD.to(x_BTD.dtype)
        cos_sin = self.model.rotary_emb(position_ids_BT, x_BTD.dtype)
        for i, layer in enumerate(self.model.layers):
            x_BTD = layer(i, x_BTD, cond_BTD, cos_sin, attention)
        return x_BTD


@torch.no_grad()
def identity_w_c(linear: nn.Linear, num_taps: int) -> None:
    """W_c = the identity on the deepest tap, zero on the others (the authors' public initialisation):
    at step 0 the condition is the deepest tap itself, which ``cond_norm`` scales like a hidden state.
    Widths that differ keep the leading ``min(D, Dt)`` dimensions. Non-zero, so the argument of
    :func:`init_w_c` holds: the extra q/k/v columns get a gradient at step 0."""
    out_features, in_features = linear.weight.shape
    tap_width = in_features // num_taps
    width = min(out_features, tap_width)
    linear.weight.zero_()
    deepest = (num_taps - 1) * tap_width
    linear.weight[:width, deepest:deepest + width] = torch.eye(width, dtype=linear.weight.dtype)


@torch.no_grad()
def init_w_c(linear: nn.Linear) -> None:
    """W_c ~ N(0, 1/fan_in): non-zero on purpose.

    With the extra q/k/v columns at zero, dL/dW_c = 0 (c only enters through those columns), and
    if W_c were zero too, c = 0 and dL/dcolumns = 0: both would stay zero forever. A non-zero W_c
    gives the columns a gradient at step 0; W_c itself gets one from step 1, once the columns moved.
    """
    nn.init.normal_(linear.weight, std=linear.in_features ** -0.5)

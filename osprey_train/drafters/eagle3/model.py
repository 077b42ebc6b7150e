"""The EAGLE-3 baseline drafter: one Llama layer reading [norm(embedding) ; norm(condition)].

Mirrors the layer SGLang's ``LlamaForCausalLMEagle3`` and vLLM's ``Eagle3LlamaForCausalLM`` run,
so the export is a renaming, not a re-computation:

    residual = cond
    h = residual + attn([input_layernorm(embed(ids)) ; hidden_norm(cond)])   # q/k/v: (out, 2D)
    h = h + mlp(post_attention_layernorm(h))                                 # returned (pre-norm)
    logits = lm_head(norm(h))                                                # draft vocabulary

With ``num_layers = N > 1`` (the paper's parameter-matched control, Table 6: a 2-layer EAGLE-3),
N - 1 plain Llama decoder layers (``layers.{i}``, hidden size D in and out) follow the
midlayer; the last one's output is the returned pre-norm hidden state. The engines' EAGLE-3
classes run one layer only, so such a drafter is trained and evaluated here but not exported
to SGLang or vLLM.

``fc`` (Linear(num_taps * Dt -> D), no bias) fuses the target taps. The embedding is over the
full target vocabulary and frozen (copied from the target). The LM head covers a draft vocabulary
of ``draft_vocab_size`` target tokens; ``draft_to_target`` maps draft ids to target ids.

Legend: B batch, T tokens, D hidden, V target vocab, Vd draft vocab.
"""

from __future__ import annotations

import torch
from torch import nn

from osprey_train.models.attention import AttentionBackend
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.layers import ConditionedAttention, RMSNorm, RotaryEmbedding, SwiGLUMLP, normal_init

__all__ = ["Eagle3Drafter", "Eagle3Layer", "PlainDecoderLayer"]


class Eagle3Layer(nn.Module):
    """The single EAGLE-3 decoder layer (names as in the engines' ``midlayer``)."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = ConditionedAttention(config, cond_width=config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config)

    def forward(self, embeds_BTD: torch.Tensor, cond_BTD: torch.Tensor,
                cos_sin: tuple[torch.Tensor, torch.Tensor], attention: AttentionBackend) -> torch.Tensor:
        h_BTD = cond_BTD + self.self_attn(0, self.input_layernorm(embeds_BTD), self.hidden_norm(cond_BTD),
                                          cos_sin, attention)
        return h_BTD + self.mlp(self.post_attention_layernorm(h_BTD))


class PlainDecoderLayer(nn.Module):
    """A Llama decoder layer without condition: the extra layers of a multi-layer EAGLE-3."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = ConditionedAttention(config, cond_width=0)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config)

    def forward(self, layer_idx: int, x_BTD: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
                attention: AttentionBackend) -> torch.Tensor:
        x_BTD = x_BTD + self.self_attn(layer_idx, self.input_layernorm(x_BTD), None, cos_sin, attention)
        return x_BTD + self.mlp(self.post_attention_layernorm(x_BTD))


class Eagle3Drafter(Drafter):
    """EAGLE-3 baseline: frozen target embedding, one layer, draft-vocabulary LM head."""

    arch = "eagle3"

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # copied from the target, frozen
        self.fc = nn.Linear(config.taps_width, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config)
        if config.num_layers > 1:   # absent for the standard 1-layer drafter: its checkpoint is unchanged
            self.layers = nn.ModuleList(PlainDecoderLayer(config) for _ in range(config.num_layers - 1))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary_emb = RotaryEmbedding(config)
        self._register_draft_vocab()
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Random init of everything (the embedding is overwritten from the target by convert)."""
        normal_init(self, std)

    def taps_projection(self) -> nn.Linear:
        return self.fc

    def final_norm(self) -> nn.Module:
        return self.norm

    def forward_hidden(self, input_ids_BT: torch.Tensor, cond_BTD: torch.Tensor,
                       position_ids_BT: torch.Tensor, attention: AttentionBackend) -> torch.Tensor:
        self._check_inputs(input_ids_BT, cond_BTD, position_ids_BT)
        embeds_BTD = self.embed_tokens(input_ids_BT)
        cos_sin = self.rotary_emb(position_ids_BT, embeds_BTD.dtype)
        h_BTD = self.midlayer(embeds_BTD, cond_BTD.to(embeds_BTD.dtype), cos_sin, attention)
        for i, layer in enumerate(getattr(self, "layers", ())):
            h_BTD = layer(i + 1, h_BTD, cos_sin, attention)
        return h_BTD

"""The DFlash block drafter: the model vLLM 0.32 serves as ``DFlashDraftModel`` (``qwen3_dflash.py``).

One forward drafts a whole block. The target's taps of the committed positions are fused once
(``fc`` then ``hidden_norm``: the *context*), and every layer turns that same context into keys
and values of its own (``k_proj`` + ``k_norm`` + RoPE at the context positions, ``v_proj``; no input
norm, no MLP on the context). The queries are the block ``[anchor, mask x (B - 1)]`` at positions
``a .. a + B - 1``, where the anchor is the last committed token ``x_a`` (the bonus token of the
previous round) and the context covers positions ``0 .. a - 1``. The block runs through ordinary
pre-norm Qwen3 layers (per-head ``q_norm``/``k_norm``, SwiGLU MLP), attending to all of its
context and to the whole block (non-causal inside the block); slot ``j`` predicts ``x_{a+j}``, so
the mask slots ``1 .. B - 1`` give ``B - 1`` drafts. vLLM feeds ``1 + K`` query slots for
``num_speculative_tokens = K``; this module drafts with any number of slots, so offline and live
drafting with ``S`` drafts use ``1 + S`` slots, exactly as the engine does.

The embedding and the LM head are the target's, copied at convert and frozen (vLLM shares the
target's own when the export carries none). The draft vocabulary is the full target vocabulary.

Training and drafting share :meth:`DFlashDrafter.block_hidden`: training draws many anchors of
a packed row at once (each with the context strictly before its anchor, within its own
document), drafting draws one per round, and the test suite checks that both give the same logits.

Legend: N blocks (anchors), B block slots, P context positions, L taps, Dt target hidden,
D drafter hidden, H query heads, Hk key/value heads, d head dim, V vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from osprey_data.errors import ModelError
from osprey_train.drafters.dflash.arch import block_size_of, mask_token_of
from osprey_train.models.attention import AttentionBackend, repeat_kv
from osprey_train.models.base import Drafter
from osprey_train.models.config import DrafterConfig
from osprey_train.models.layers import RMSNorm, RotaryEmbedding, SwiGLUMLP, normal_init, apply_rotary

__all__ = ["DFlashDrafter", "DFlashLayer", "DFlashAttention", "LayerContext"]

LayerContext = tuple[torch.Tensor, torch.Tensor]
"""One layer's context keys and values, ``(k_HkPd, v_HkPd)``: rotated, k-normed, ready to attend to."""


class DFlashAttention(nn.Module):
    """Qwen3 attention whose keys and values are the context's (projected by this layer) plus the block's."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        width = config.hidden_size
        self.q_proj = nn.Linear(width, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, width, bias=False)
        # vLLM's layer always has per-head q/k norms; a drafter started from a Llama backbone has none
        # (an RMSNorm is not the identity at any weight, so adding one would break "computes what the
        # backbone computed")
        if config.qk_norm:
            self.q_norm: nn.Module = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm: nn.Module = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = nn.Identity()

    def context_kv(self, ctx_PD: torch.Tensor, cos_sin_1Pd: tuple[torch.Tensor, torch.Tensor]) -> LayerContext:
        """This layer's keys and values of the (hidden-normed) fused context."""
        positions = ctx_PD.shape[0]
        k = self.k_norm(self.k_proj(ctx_PD).view(positions, self.num_kv_heads, self.head_dim))
        v = self.v_proj(ctx_PD).view(positions, self.num_kv_heads, self.head_dim)
        k_1HkPd = apply_rotary(k.transpose(0, 1)[None], *cos_sin_1Pd)
        return k_1HkPd[0], v.transpose(0, 1)

    def forward(self, x_NBD: torch.Tensor, cos_sin_NBd: tuple[torch.Tensor, torch.Tensor], context: LayerContext,
                allowed_NP: torch.Tensor) -> torch.Tensor:
        n, b, _ = x_NBD.shape
        q = self.q_norm(self.q_proj(x_NBD).view(n, b, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x_NBD).view(n, b, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v_NHkBd = self.v_proj(x_NBD).view(n, b, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q_NHBd, k_NHkBd = apply_rotary(q, *cos_sin_NBd), apply_rotary(k, *cos_sin_NBd)
        k_ctx, v_ctx = context
        scale = 1.0 / math.sqrt(self.head_dim)
        # scores against the context (masked per block) and against the block itself (all slots), one softmax
        k_ctx_HPd = repeat_kv(k_ctx[None], self.num_heads)[0]
        v_ctx_HPd = repeat_kv(v_ctx[None], self.num_heads)[0]
        ctx_NHBP = torch.einsum("nhbd,hpd->nhbp", q_NHBd.float(), k_ctx_HPd.float()) * scale
        ctx_NHBP = ctx_NHBP.masked_fill(~allowed_NP[:, None, None, :], float("-inf"))
        k_blk = repeat_kv(k_NHkBd, self.num_heads).float()
        blk_NHBB = torch.einsum("nhbd,nhcd->nhbc", q_NHBd.float(), k_blk) * scale
        probs = torch.softmax(torch.cat([ctx_NHBP, blk_NHBB], dim=-1), dim=-1)
        p_ctx, p_blk = probs.split([ctx_NHBP.shape[-1], b], dim=-1)
        out = torch.einsum("nhbp,hpd->nhbd", p_ctx, v_ctx_HPd.float())
        out = out + torch.einsum("nhbc,nhcd->nhbd", p_blk, repeat_kv(v_NHkBd, self.num_heads).float())
        out_NBX = out.to(x_NBD.dtype).transpose(1, 2).reshape(n, b, self.num_heads * self.head_dim)
        return self.o_proj(out_NBX)


class DFlashLayer(nn.Module):
    """A pre-norm Qwen3 decoder layer over the block, attending to the context (vLLM's names)."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config)

    def forward(self, h_NBD: torch.Tensor, cos_sin_NBd: tuple[torch.Tensor, torch.Tensor], context: LayerContext,
                allowed_NP: torch.Tensor) -> torch.Tensor:
        h_NBD = h_NBD + self.self_attn(self.input_layernorm(h_NBD), cos_sin_NBd, context, allowed_NP)
        return h_NBD + self.mlp(self.post_attention_layernorm(h_NBD))


class DFlashDrafter(Drafter):
    """DFlash: target embedding and head (frozen), ``fc`` + ``hidden_norm`` on the taps, Qwen3 layers."""

    arch = "dflash"

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.fc = nn.Linear(config.taps_width, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary_emb = RotaryEmbedding(config)
        self.reset_parameters()
        # the target's, copied by convert: never trained (vLLM serves the target's own in their place)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    @property
    def block_size(self) -> int:
        """Slots of the trained block: one anchor and ``block_size - 1`` mask slots (drafts)."""
        return block_size_of(self.config)

    @property
    def mask_token_id(self) -> int:
        """The token id fed at the mask slots (its embedding row is the target's)."""
        return mask_token_of(self.config)

    def reset_parameters(self, std: float = 0.02) -> None:
        """Random init of everything (convert overwrites the embedding and the head from the target)."""
        normal_init(self, std)

    def taps_projection(self) -> nn.Linear:
        return self.fc

    def final_norm(self) -> nn.Module:
        return self.norm

    def forward_hidden(self, input_ids_BT, cond_BTD, position_ids_BT, attention: AttentionBackend):
        raise ModelError("the dflash drafter drafts whole blocks (block_hidden), not chain steps; chain drafting, "
                         "TTT and trees do not apply to it")

    # -- blocks --------------------------------------------------------------------------
    def context(self, taps_PLDt: torch.Tensor, positions_P: torch.Tensor) -> list[LayerContext]:
        """Every layer's context keys and values for the taps of positions ``positions_P``."""
        ctx_PD = self.hidden_norm(self.fuse_taps(taps_PLDt))
        cos_sin = self.rotary_emb(positions_P[None], ctx_PD.dtype)
        return [layer.self_attn.context_kv(ctx_PD, cos_sin) for layer in self.layers]

    def block_hidden(self, anchor_ids_N: torch.Tensor, anchor_positions_N: torch.Tensor, slots: int,
                     context: list[LayerContext], allowed_NP: torch.Tensor) -> torch.Tensor:
        """The last layer's output (before the final norm) of ``N`` blocks of ``slots`` slots.

        Block ``n`` is ``[anchor_ids_N[n], mask x (slots - 1)]`` at positions
        ``anchor_positions_N[n] + 0 .. slots - 1``; it attends to the context positions where
        ``allowed_NP[n]`` is True and to all of its own slots."""
        if slots < 2:
            raise ModelError(f"dflash: a block needs an anchor and at least one mask slot, got {slots} slots")
        if allowed_NP.shape != (anchor_ids_N.shape[0], context[0][0].shape[1]):
            raise ModelError(f"dflash: context mask has shape {tuple(allowed_NP.shape)}, expected "
                             f"({anchor_ids_N.shape[0]}, {context[0][0].shape[1]}) (blocks, context positions)")
        device = anchor_ids_N.device
        ids_NB = torch.full((anchor_ids_N.shape[0], slots), self.mask_token_id, dtype=torch.long, device=device)
        ids_NB[:, 0] = anchor_ids_N
        positions_NB = anchor_positions_N[:, None] + torch.arange(slots, device=device)
        h_NBD = self.embed_tokens(ids_NB)
        cos_sin = self.rotary_emb(positions_NB, h_NBD.dtype)
        for layer, layer_context in zip(self.layers, context):
            h_NBD = layer(h_NBD, cos_sin, layer_context, allowed_NP)
        return h_NBD

    @torch.no_grad()
    def block_logits(self, token_ids_T: torch.Tensor, hidden_TLDt: torch.Tensor, anchors_N: torch.Tensor,
                     slots: int) -> torch.Tensor:
        """Logits ``(N, slots - 1, V)`` of the mask slots of the blocks anchored at positions ``anchors_N``
        of one sequence (context: the taps of positions ``0 .. anchor - 1``), as a live round drafts them."""
        return self.context_block_logits(token_ids_T, self.sequence_context(token_ids_T, hidden_TLDt), anchors_N,
                                         slots)

    def sequence_context(self, token_ids_T: torch.Tensor, hidden_TLDt: torch.Tensor) -> list[LayerContext]:
        """Every layer's context keys and values over all positions of one sequence."""
        positions = int(token_ids_T.shape[0])
        return self.context(hidden_TLDt[:positions].to(self.fc.weight.dtype),
                            torch.arange(positions, device=token_ids_T.device))

    @torch.no_grad()
    def context_block_logits(self, token_ids_T: torch.Tensor, context: list[LayerContext], anchors_N: torch.Tensor,
                             slots: int) -> torch.Tensor:
        """:meth:`block_logits` over a context already computed (:meth:`sequence_context`): blocks see the
        positions before their anchor."""
        positions = int(token_ids_T.shape[0])
        allowed_NP = torch.arange(positions, device=token_ids_T.device)[None] < anchors_N[:, None]
        hidden = self.block_hidden(token_ids_T[anchors_N].long(), anchors_N, slots, context, allowed_NP)
        return self.logits(hidden[:, 1:]).float()

"""The common base of every drafter: what the trainer, evaluator and live decoder rely on.

A drafter turns the target's tapped hidden states into a condition (``fuse_taps``), runs one
draft step over a block of tokens (``forward_hidden``, returning the last layer's output before
the final norm so that Training-Time Test can feed it back as the next condition), and maps a
hidden state to logits over its draft vocabulary (``head_input`` + ``lm_head``).

Legend: B batch, T tokens, L taps, Dt target hidden, D drafter hidden, V draft vocab.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from osprey_data.errors import ModelError
from osprey_train.models.attention import AttentionBackend, CausalAttention
from osprey_train.models.config import DrafterConfig

__all__ = ["Drafter"]


class Drafter(nn.Module):
    """Base class of OspreyDrafter and Eagle3Drafter."""

    arch: ClassVar[str]
    """The ``config.arch`` this class builds (its name in osprey_train/drafters/registry.py)."""
    config: DrafterConfig
    lm_head: nn.Linear

    def __init__(self, config: DrafterConfig) -> None:
        if config.arch != self.arch:
            raise ModelError(f"{type(self).__name__} needs arch {self.arch!r}, got {config.arch!r}")
        super().__init__()
        self.config = config

    # -- subclasses provide these ------------------------------------------------------
    def taps_projection(self) -> nn.Linear:
        """The Linear(num_taps * Dt -> D) that fuses the taps (W_c / fc)."""
        raise NotImplementedError

    def final_norm(self) -> nn.Module:
        """The norm applied before the LM head."""
        raise NotImplementedError

    def forward_hidden(self, input_ids_BT: torch.Tensor, cond_BTD: torch.Tensor,
                       position_ids_BT: torch.Tensor, attention: AttentionBackend) -> torch.Tensor:
        """One draft step; returns the last layer's output (B, T, D) before the final norm."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------
    def _register_draft_vocab(self) -> None:
        """The ``d2t`` buffer: absolute draft id -> target id, identity until :meth:`set_draft_vocab`.

        (The engines store the offset ``d2t - arange``; the exporters convert.)
        """
        self.register_buffer("d2t", torch.arange(self.config.draft_vocab_size, dtype=torch.long))

    @property
    def draft_to_target(self) -> torch.Tensor | None:
        """Draft id -> target id (LongTensor (V_draft,)) when the draft vocab is a subset, else None."""
        return getattr(self, "d2t", None)

    @torch.no_grad()
    def set_draft_vocab(self, draft_to_target: torch.Tensor) -> None:
        """Install the draft vocabulary: strictly increasing target ids, one per LM-head row."""
        if self.draft_to_target is None:
            raise ModelError("this drafter predicts the full target vocabulary (draft_vocab_size == vocab_size); "
                             "it has no draft vocabulary to set")
        ids = torch.as_tensor(draft_to_target, dtype=torch.long)
        cfg = self.config
        if ids.shape != (cfg.draft_vocab_size,):
            raise ModelError(f"draft vocabulary has {tuple(ids.shape)} ids, expected ({cfg.draft_vocab_size},)")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
            raise ModelError(f"draft vocabulary ids must lie in [0, {cfg.vocab_size})")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ModelError("draft vocabulary ids must be strictly increasing (sorted, no duplicates)")
        self.d2t.copy_(ids.to(self.d2t.device))

    def target_to_draft_mask(self) -> torch.Tensor:
        """t2d: bool (V,), True where the target token is in the draft vocabulary (all True without one)."""
        d2t = self.draft_to_target
        if d2t is None:
            return torch.ones(self.config.vocab_size, dtype=torch.bool, device=self.lm_head.weight.device)
        mask = torch.zeros(self.config.vocab_size, dtype=torch.bool, device=d2t.device)
        mask[d2t] = True
        return mask

    def fuse_taps(self, taps_BTLDt: torch.Tensor) -> torch.Tensor:
        """Project the concatenated target taps (B, T, L, Dt) to the condition (B, T, D)."""
        cfg = self.config
        if taps_BTLDt.shape[-2:] != (cfg.num_taps, cfg.target_hidden_size):
            raise ModelError(
                f"fuse_taps: taps have shape {tuple(taps_BTLDt.shape)}; this drafter expects "
                f"(..., {cfg.num_taps}, {cfg.target_hidden_size}) (num_taps, target_hidden_size)"
            )
        proj = self.taps_projection()
        flat = taps_BTLDt.reshape(*taps_BTLDt.shape[:-2], cfg.taps_width).to(proj.weight.dtype)
        return proj(flat)

    def head_input(self, hidden_BTD: torch.Tensor) -> torch.Tensor:
        """The final norm: what the LM head reads."""
        return self.final_norm()(hidden_BTD)

    def logits(self, hidden_BTD: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (B, T, V_draft)."""
        return self.lm_head(self.head_input(hidden_BTD))

    def forward(self, input_ids_BT: torch.Tensor, cond_BTD: torch.Tensor,
                position_ids_BT: torch.Tensor | None = None,
                attention: AttentionBackend | None = None) -> torch.Tensor:
        """Convenience: logits of one causal draft step (positions 0..T-1 when not given)."""
        if position_ids_BT is None:
            position_ids_BT = torch.arange(input_ids_BT.shape[1], device=input_ids_BT.device)
            position_ids_BT = position_ids_BT[None].expand_as(input_ids_BT)
        hidden = self.forward_hidden(input_ids_BT, cond_BTD, position_ids_BT,
                                     attention if attention is not None else CausalAttention())
        return self.logits(hidden)

    def _check_inputs(self, input_ids_BT: torch.Tensor, cond_BTD: torch.Tensor,
                      position_ids_BT: torch.Tensor) -> None:
        if input_ids_BT.dim() != 2:
            raise ModelError(f"forward_hidden: input_ids must be (B, T), got shape {tuple(input_ids_BT.shape)}")
        expected = (*input_ids_BT.shape, self.config.hidden_size)
        if tuple(cond_BTD.shape) != expected:
            raise ModelError(f"forward_hidden: cond has shape {tuple(cond_BTD.shape)}, expected {expected}")
        if tuple(position_ids_BT.shape) != tuple(input_ids_BT.shape):
            raise ModelError(
                f"forward_hidden: position_ids has shape {tuple(position_ids_BT.shape)}, "
                f"input_ids has {tuple(input_ids_BT.shape)}"
            )

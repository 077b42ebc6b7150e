"""Training-Time-Test (TTT) attention: the attention pattern of an unrolled EAGLE-3 draft chain.

Slot convention (used everywhere in ``osprey_train.ttt``; what a slot holds is the engine layout
of :mod:`osprey_train.ttt.layout`): slot ``t`` of TTT step ``k`` holds the chain that starts at
slot ``t``; at step ``k`` it processes the token of slot ``t + k``. In real speculative decoding
that token attends to the drafter's KV cache of the accepted prefix (computed with target
features, i.e. the *step-0* keys at slots ``<= t``) and to the keys of the tokens the chain
itself drafted so far (steps ``1..k`` of the *same slot*).
So at step ``k`` the query of slot ``t`` sees:

* step-0 keys at slots ``s <= t`` of the same document, and
* the keys of steps ``1..k`` at slot ``t`` only (a "diagonal").

The backend caches the keys/values of every step per layer. It plugs into
``Drafter.forward_hidden`` as an ``AttentionBackend`` through :meth:`TTTAttention.at_step`, which
returns a callable bound to one step (so gradient-checkpoint recomputation of a step re-binds the
same step, not the latest one).

Implementations (registry ``TTT_IMPLS``), all exact and interchangeable:

* ``flex``  — ``torch.nn.attention.flex_attention`` over the concatenated keys of steps ``0..k``
  with a ``BlockMask``; on GPU (compiled) memory is linear in T, blocks that are fully masked are
  skipped, so the diagonal costs ``O(k T)`` not ``O(k T^2)``.
* ``sdpa``  — the step-0 part through ``scaled_dot_product_attention`` (fused kernels), its
  log-sum-exp recomputed blockwise, and the ``k`` diagonal scores per query merged in by
  log-sum-exp. Never builds a ``[T, (k+1)T]`` mask (only SDPA's ``[T, T]`` document mask when the
  batch is packed).
* ``eager`` — pure PyTorch, query blocks of ``block_size``: scores ``[Bq, T]`` plus ``[Bq, k]``
  diagonal scores, joint softmax, each block under activation checkpointing, so saved memory is
  ``O(T)`` per head and transient memory ``O(Bq T)``.
* ``naive`` — the reference: materializes the full ``[T, (k+1)T]`` mask. Tests and benchmarks only.

Legend: B batch, H query heads, Hk key/value heads, T tokens (slots), d head dim, k TTT step.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from osprey_data.errors import BackendUnavailableError, ConfigError

__all__ = ["TTTAttention", "TTTStepAttention", "TTT_IMPLS", "flex_available", "document_positions",
           "resolve_impl"]


def flex_available() -> bool:
    """Whether this torch ships ``flex_attention``."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def document_positions(doc_ids_BT: Tensor) -> Tensor:
    """Position of every slot inside its document (0 at each document start)."""
    B, T = doc_ids_BT.shape
    idx_BT = torch.arange(T, device=doc_ids_BT.device).expand(B, T)
    starts_BT = torch.ones_like(doc_ids_BT, dtype=torch.bool)
    starts_BT[:, 1:] = doc_ids_BT[:, 1:] != doc_ids_BT[:, :-1]
    start_idx_BT = torch.where(starts_BT, idx_BT, torch.zeros_like(idx_BT))
    start_idx_BT = torch.cummax(start_idx_BT, dim=1).values
    return idx_BT - start_idx_BT


def _repeat_kv(x_BHkTd: Tensor, num_heads: int) -> Tensor:
    rep = num_heads // x_BHkTd.shape[1]
    return x_BHkTd if rep == 1 else x_BHkTd.repeat_interleave(rep, dim=1)


def _causal_doc_mask(doc_ids_BT: Tensor, q_lo: int, q_hi: int, kv_len: int) -> Tensor:
    """Bool ``[B, 1, q_hi-q_lo, kv_len]``: same document and key slot <= query slot."""
    dev = doc_ids_BT.device
    q_idx = torch.arange(q_lo, q_hi, device=dev)[:, None]
    kv_idx = torch.arange(kv_len, device=dev)[None, :]
    causal = kv_idx <= q_idx
    same_doc = doc_ids_BT[:, q_lo:q_hi, None] == doc_ids_BT[:, None, :kv_len]
    return (causal[None] & same_doc)[:, None]


# --- implementations --------------------------------------------------------------------------
# Each takes q [B,H,T,d], the lists of cached keys/values of steps 0..k (already GQA-expanded),
# the document ids [B,T] and the scale, and returns out [B,H,T,d].


def _naive(q, ks, vs, doc_ids_BT, scale, block_size, state=None):
    T = q.shape[2]
    k_steps = len(ks) - 1
    mask0 = _causal_doc_mask(doc_ids_BT, 0, T, T)
    eye = torch.eye(T, dtype=torch.bool, device=q.device)[None, None].expand_as(mask0)
    mask = torch.cat([mask0] + [eye] * k_steps, dim=-1)  # [B,1,T,(k+1)T], the thing others avoid
    keys = torch.cat(ks, dim=2)
    vals = torch.cat(vs, dim=2)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), vals)


def _diag_scores(q_blk, ks_blk, scale):
    """Scores of each query against its own slot's keys of steps 1..k: [B,H,Bq,k]."""
    return torch.stack([(q_blk * kj).sum(-1) for kj in ks_blk], dim=-1) * scale


def _eager_block(scale, q_blk, k0, v0, mask_blk, *diag):
    half = len(diag) // 2
    ks_blk, vs_blk = diag[:half], diag[half:]
    s0 = torch.matmul(q_blk, k0.transpose(-1, -2)) * scale
    s0 = s0.masked_fill(~mask_blk, float("-inf"))
    if half:
        sd = _diag_scores(q_blk, ks_blk, scale)
        p = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1)
        p0, pd = p[..., : s0.shape[-1]], p[..., s0.shape[-1]:]
        out = torch.matmul(p0, v0)
        for j, vj in enumerate(vs_blk):
            out = out + pd[..., j : j + 1] * vj
        return out
    return torch.matmul(torch.softmax(s0, dim=-1), v0)


def _eager(q, ks, vs, doc_ids_BT, scale, block_size, state=None):
    T = q.shape[2]
    outs = []
    for lo in range(0, T, block_size):
        hi = min(T, lo + block_size)
        # Keys after the block's last query are never attended (causal): slice them away.
        mask_blk = _causal_doc_mask(doc_ids_BT, lo, hi, hi)
        args = [scale, q[:, :, lo:hi], ks[0][:, :, :hi], vs[0][:, :, :hi], mask_blk]
        args += [kj[:, :, lo:hi] for kj in ks[1:]] + [vj[:, :, lo:hi] for vj in vs[1:]]
        if torch.is_grad_enabled() and q.requires_grad:
            outs.append(checkpoint(_eager_block, *args, use_reentrant=False))
        else:
            outs.append(_eager_block(*args))
    return torch.cat(outs, dim=2)


def _block_lse(q_blk, k0, mask_blk, scale):
    s0 = torch.matmul(q_blk, k0.transpose(-1, -2)) * scale
    return torch.logsumexp(s0.masked_fill(~mask_blk, float("-inf")), dim=-1)


def _sdpa(q, ks, vs, doc_ids_BT, scale, block_size, state=None):
    T = q.shape[2]
    single_doc = bool((doc_ids_BT == doc_ids_BT[:, :1]).all())
    mask = None if single_doc else _causal_doc_mask(doc_ids_BT, 0, T, T)
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        # CPU's bf16 flash-attention backward is 3.6x slower than float32's (docs/distill.md,
        # "Where a bf16-autocast step's time goes"), and the casts cost less than that saves
        with torch.autocast("cpu", enabled=False):
            out0 = F.scaled_dot_product_attention(q.float(), ks[0].float(), vs[0].float(), attn_mask=mask,
                                                  is_causal=single_doc, scale=scale)
    else:
        out0 = F.scaled_dot_product_attention(q, ks[0], vs[0], attn_mask=mask,
                                              is_causal=single_doc, scale=scale)
    if len(ks) == 1:
        return out0
    # log-sum-exp of the step-0 part, blockwise and checkpointed (no [T, T] scores kept).
    lses = []
    for lo in range(0, T, block_size):
        hi = min(T, lo + block_size)
        args = (q[:, :, lo:hi], ks[0][:, :, :hi], _causal_doc_mask(doc_ids_BT, lo, hi, hi), scale)
        if torch.is_grad_enabled() and q.requires_grad:
            lses.append(checkpoint(_block_lse, *args, use_reentrant=False))
        else:
            lses.append(_block_lse(*args))
    lse0_BHT = torch.cat(lses, dim=2)
    sd_BHTk = _diag_scores(q, ks[1:], scale)
    lse_BHT = torch.logaddexp(lse0_BHT, torch.logsumexp(sd_BHTk, dim=-1))
    out = torch.exp(lse0_BHT - lse_BHT)[..., None] * out0
    pd_BHTk = torch.exp(sd_BHTk - lse_BHT[..., None])
    for j, vj in enumerate(vs[1:]):
        out = out + pd_BHTk[..., j : j + 1] * vj
    return out


def _flex(q, ks, vs, doc_ids_BT, scale, block_size, state=None):
    if not flex_available():
        raise BackendUnavailableError(
            "TTT attention 'flex' needs torch.nn.attention.flex_attention (torch >= 2.5); "
            "use --attention sdpa or eager")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad:
        raise BackendUnavailableError(
            "flex_attention has no backward on CPU in this torch; train on CPU with "
            "--attention sdpa (or eager); flex is for CUDA")
    B, H, T, head_dim = q.shape
    if q.device.type == "cuda" and head_dim < 16:
        # The compiled kernel's lowering refuses it deep inside inductor; say so up front.
        raise BackendUnavailableError(
            f"TTT attention 'flex' on CUDA needs a head dimension of at least 16 (this drafter has "
            f"{head_dim}); use --attention sdpa")
    kv_len = T * len(ks)
    docs = doc_ids_BT

    def mask_mod(b, h, q_idx, kv_idx):
        step = kv_idx // T
        kv_pos = kv_idx % T
        causal0 = (step == 0) & (kv_pos <= q_idx) & (docs[b, q_idx] == docs[b, kv_pos])
        return causal0 | ((step > 0) & (kv_pos == q_idx))

    # One BlockMask per step, shared by all layers of that step (state is the TTTAttention's).
    # Built with mask_mod evaluated blockwise by torch; on CUDA it is compiled, so the dense
    # [T, (k+1)T] mask is never formed there.
    key = ("flex_mask", B, T, kv_len)
    block_mask = None if state is None else state.get(key)
    if block_mask is None:
        block_mask = create_block_mask(mask_mod, B, None, T, kv_len, device=q.device,
                                       # the compiled CUDA kernel tiles by 128: other block
                                       # sizes fail its lowering
                                       BLOCK_SIZE=128 if q.device.type == "cuda" else min(128, max(16, block_size)),
                                       _compile=q.device.type == "cuda")
        if state is not None:
            state[key] = block_mask
    # Uncompiled flex runs a dense reference; on CUDA compile it once so it is memory-linear.
    fn = _compiled_flex(flex_attention) if q.device.type == "cuda" else flex_attention
    return fn(q, torch.cat(ks, dim=2), torch.cat(vs, dim=2), block_mask=block_mask, scale=scale)


_COMPILED: dict[str, Callable] = {}


def _compiled_flex(fn: Callable) -> Callable:
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(fn, dynamic=True)
    return _COMPILED["flex"]


def resolve_impl(name: str, device: torch.device | str) -> str:
    """``auto`` -> ``flex`` on CUDA when available, else ``sdpa``; other names pass through."""
    if name != "auto":
        return name
    return "flex" if torch.device(device).type == "cuda" and flex_available() else "sdpa"


TTT_IMPLS: dict[str, Callable] = {"flex": _flex, "sdpa": _sdpa, "eager": _eager, "naive": _naive}


class TTTStepAttention:
    """An ``AttentionBackend`` bound to one TTT step of a :class:`TTTAttention`."""

    def __init__(self, parent: "TTTAttention", step: int) -> None:
        self.parent = parent
        self.step = step

    def __call__(self, layer_idx: int, q_BHTd: Tensor, k_BHkTd: Tensor, v_BHkTd: Tensor) -> Tensor:
        return self.parent._attend(self.step, layer_idx, q_BHTd, k_BHkTd, v_BHkTd)


class TTTAttention:
    """Key/value cache across TTT steps plus the step-k attention pattern (see module doc).

    ``doc_ids_BT`` gives each slot's document (packed samples never attend to each other); ``None``
    means one document per row. Call ``at_step(k)`` for the backend of step ``k``; step ``k`` must
    follow steps ``0..k-1`` on every layer (their keys are read from the cache).
    """

    def __init__(self, doc_ids_BT: Tensor | None = None, *, impl: str = "sdpa",
                 block_size: int = 256, scale: float | None = None) -> None:
        if impl not in TTT_IMPLS:
            raise ConfigError(f"unknown TTT attention implementation {impl!r}; "
                              f"choose one of {sorted(TTT_IMPLS)}")
        if impl == "flex" and not flex_available():
            raise BackendUnavailableError("flex_attention is not available in this torch")
        self.doc_ids_BT = doc_ids_BT
        self.impl = impl
        self.block_size = int(block_size)
        self.scale = scale
        self._cache: dict[int, dict[int, tuple[Tensor, Tensor]]] = {}
        self._state: dict = {}

    def at_step(self, step: int) -> TTTStepAttention:
        return TTTStepAttention(self, step)

    def reset(self) -> None:
        self._cache.clear()
        self._state.clear()

    def _attend(self, step: int, layer_idx: int, q, k, v) -> Tensor:
        B, H, T, d = q.shape
        layer = self._cache.setdefault(layer_idx, {})
        # Overwrite (not append): a checkpoint recomputation of step k re-stores identical keys.
        layer[step] = (k, v)
        missing = [s for s in range(step) if s not in layer]
        if missing:
            raise RuntimeError(f"TTT step {step} of layer {layer_idx} ran before steps {missing}")
        doc = self.doc_ids_BT
        if doc is None:
            doc = torch.zeros(B, T, dtype=torch.long, device=q.device)
        ks = [_repeat_kv(layer[s][0], H) for s in range(step + 1)]
        vs = [_repeat_kv(layer[s][1], H) for s in range(step + 1)]
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(d)
        return TTT_IMPLS[self.impl](q, ks, vs, doc.to(q.device), scale, self.block_size, self._state)

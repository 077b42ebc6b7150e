"""Offline tree drafting: SGLang's EAGLE tree grown at every verify-round root of a stored sequence at once.

The drafter side of :mod:`tree_acceptance`. A verify round that starts with ``x_0 .. x_{q+1}``
committed drafts from slot ``q`` (the engine layout of :mod:`osprey_train.ttt.layout`: slot ``j``
holds ``(x_{j+1}, fuse_taps(c_j))`` at position ``j``); the tree grown there depends only on that
prefix, so the trees of all roots of a sample are grown together, one batched drafter pass per
depth (``O(steps)`` passes per sample, as chain drafting does with
:func:`~osprey_train.evaluation.chain_draft.draft_all_positions`). The rules that pick tokens
(top-k expansion, frontier, scores) are :class:`~osprey_train.evaluation.tree_growth.TreeGrower`'s.

What a node at depth ``d`` below root ``q`` is fed (SGLang's draft decode):

* token: its own; condition: the pre-norm hidden state of its parent (the root's output for
  depth 1); RoPE position ``q + d``;
* attention: the target-conditioned slots ``0 .. q`` (step-0 keys) plus the keys of earlier
  depths named by ``kv``:

  - ``"sglang"`` (what SGLang computes): the drafter KV cache holds one entry per (frontier slot,
    depth) and frontier slot ``j`` at depth ``d`` attends to the entries of slot ``j`` at depths
    ``1 .. d`` (``generate_draft_decode_kv_indices``). The frontier is re-chosen at every depth
    and SGLang does not move the cache entries along, so for ``topk > 1`` a node can see entries of
    another branch instead of its own ancestors;
  - ``"ancestors"``: its own ancestors' entries (an exact tree attention, as the EAGLE reference
    implementation computes it).

  The two agree for ``topk = 1`` (a chain) and up to the depth-2 candidates (the first frontier
  attends to no other tree node).

Legend: T tokens, P = T - 1 slots, R roots, K top-k, N = R*K frontier nodes, L taps, Dt target
hidden, D drafter hidden, H query heads, Hk key/value heads, d head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from osprey_train.evaluation.options import KV_MODES
from osprey_train.evaluation.tree_growth import TreeCandidates, TreeGrower, node_topk
from osprey_train.models.attention import repeat_kv
from osprey_train.ttt.layout import slot_inputs
from osprey_train.ttt.loss import VocabMap

__all__ = ["KV_MODES", "DraftPrefix", "draft_prefix", "grow_trees", "hidden_topk", "round_roots"]

"""Which earlier tree nodes a drafted node attends to (see the module docstring)."""


def round_roots(num_tokens: int, prompt_length: int) -> range:
    """Slots that can start a verify round: ``r - 1 .. T - 3`` (the prefill yields ``x_r``)."""
    return range(max(int(prompt_length), 1) - 1, max(int(num_tokens) - 2, 0))


def hidden_topk(drafter, hidden_ND: Tensor, k: int, chunk: int = 1024) -> tuple[Tensor, Tensor]:
    """:func:`node_topk` of the drafter's logits, ``chunk`` rows at a time (draft ids, probabilities)."""
    ids, probs = [], []
    for i in range(0, hidden_ND.shape[0], chunk):
        a, b = node_topk(drafter.logits(hidden_ND[i:i + chunk]), k)
        ids.append(a)
        probs.append(b)
    return torch.cat(ids), torch.cat(probs)


class _TreeBatchAttention:
    """Attention backend of batched tree growth over one document's slots.

    First call per layer (``prefix`` phase): the slots, causally; their keys/values are kept.
    Later calls (one per depth): queries of the frontier nodes, query ``n`` sees the prefix keys of
    slots ``<= query_slot[n]`` and, for each depth ``j`` so far, the node ``history[j][n]`` of that
    depth (the query's own key being the last one).
    """

    def __init__(self, block: int = 2048) -> None:
        self.block = block
        self.prefix = True
        self.k0: dict[int, Tensor] = {}
        self.v0: dict[int, Tensor] = {}
        self.node_k: dict[int, list[Tensor]] = {}
        self.node_v: dict[int, list[Tensor]] = {}
        self.query_slot_N: Tensor | None = None
        self.history: list[Tensor] = []

    def __call__(self, layer_idx: int, q_BHTd: Tensor, k_BHkTd: Tensor, v_BHkTd: Tensor) -> Tensor:
        H = q_BHTd.shape[1]
        scale = 1.0 / math.sqrt(q_BHTd.shape[-1])
        if self.prefix:
            self.k0[layer_idx], self.v0[layer_idx] = k_BHkTd, v_BHkTd
            return F.scaled_dot_product_attention(q_BHTd, repeat_kv(k_BHkTd, H), repeat_kv(v_BHkTd, H),
                                                  is_causal=True, scale=scale)
        self.node_k.setdefault(layer_idx, []).append(k_BHkTd)
        self.node_v.setdefault(layer_idx, []).append(v_BHkTd)
        depths = len(self.node_k[layer_idx])
        assert depths == len(self.history), (depths, len(self.history))
        last_slot = int(self.query_slot_N.max()) + 1
        k0 = repeat_kv(self.k0[layer_idx][:, :, :last_slot], H)
        v0 = repeat_kv(self.v0[layer_idx][:, :, :last_slot], H)
        slots_S = torch.arange(last_slot, device=q_BHTd.device)
        out = []
        for lo in range(0, q_BHTd.shape[2], self.block):
            hi = min(lo + self.block, q_BHTd.shape[2])
            q = q_BHTd[:, :, lo:hi]
            s0 = torch.matmul(q, k0.transpose(-1, -2)) * scale
            s0 = s0.masked_fill(slots_S[None, :] > self.query_slot_N[lo:hi, None], float("-inf"))
            ks = [repeat_kv(self.node_k[layer_idx][j][:, :, self.history[j][lo:hi]], H) for j in range(depths)]
            vs = [repeat_kv(self.node_v[layer_idx][j][:, :, self.history[j][lo:hi]], H) for j in range(depths)]
            sd = torch.stack([(q * kj).sum(-1) for kj in ks], dim=-1) * scale
            p = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1)
            o = torch.matmul(p[..., :last_slot], v0)
            for j, vj in enumerate(vs):
                o = o + p[..., last_slot + j:last_slot + j + 1] * vj
            out.append(o)
        return torch.cat(out, dim=2)


@dataclass
class DraftPrefix:
    """The target-conditioned pass over a document's slots, shared by every tree grown on it."""

    hidden_PD: Tensor
    """Step-0 hidden state of every slot (the roots' states)."""
    keys: dict[int, Tensor]
    """layer -> step-0 keys (1, Hk, P, d)."""
    values: dict[int, Tensor]


@torch.no_grad()
def draft_prefix(drafter, token_ids_T: Tensor, taps_TLDt: Tensor) -> DraftPrefix:
    """Run the drafter over the engine-layout slots of a document (SGLang's draft extend)."""
    device = next(drafter.parameters()).device
    dtype = next(drafter.parameters()).dtype
    ids_P, taps_PLDt = slot_inputs(token_ids_T.to(device).long(), taps_TLDt.to(device=device, dtype=dtype))
    attn = _TreeBatchAttention()
    positions_1P = torch.arange(ids_P.shape[0], device=device)[None]
    hidden_1PD = drafter.forward_hidden(ids_P[None], drafter.fuse_taps(taps_PLDt[None]), positions_1P, attn)
    return DraftPrefix(hidden_PD=hidden_1PD[0], keys=attn.k0, values=attn.v0)


@torch.no_grad()
def grow_trees(drafter, token_ids_T: Tensor, taps_TLDt: Tensor, roots_R: Tensor, *, topk: int, steps: int,
               kv: str = "sglang", prefix: DraftPrefix | None = None) -> TreeCandidates:
    """Grow the tree of every root slot in ``roots_R`` to ``steps`` depths (candidates on the CPU).

    ``roots_R`` are slot indices (:func:`round_roots`); tokens are target-vocabulary ids.
    ``prefix`` (:func:`draft_prefix` of the same document) saves its pass when several trees are grown.
    """
    if kv not in KV_MODES:
        raise ValueError(f"kv must be one of {KV_MODES}, got {kv!r}")
    device = next(drafter.parameters()).device
    prefix = prefix or draft_prefix(drafter, token_ids_T, taps_TLDt)
    roots_R = roots_R.to(device).long()
    R, K = roots_R.shape[0], topk
    vocab = VocabMap.from_drafter(drafter.draft_to_target, drafter.config.vocab_size)
    grower = TreeGrower(K, vocab.to_target)
    root_hidden_RD = prefix.hidden_PD[roots_R]
    tokens_RK = grower.start(*hidden_topk(drafter, root_hidden_RD, K))
    attn = _TreeBatchAttention()
    attn.prefix = False
    attn.k0, attn.v0 = prefix.keys, prefix.values
    attn.query_slot_N = roots_R.repeat_interleave(K)
    cond_ND = root_hidden_RD.repeat_interleave(K, dim=0)
    rows_N = torch.arange(R * K, device=device)
    parent_row_N = rows_N  # each depth's nodes' parents among the previous depth's rows (set below)
    for depth in range(1, steps):
        if kv == "sglang" or depth == 1:
            attn.history.append(rows_N)
        else:  # the parent's own history (its ancestors and itself), then the node itself
            attn.history = [h[parent_row_N] for h in attn.history] + [rows_N]
        hidden_ND = drafter.forward_hidden(tokens_RK.reshape(1, -1), cond_ND[None],
                                           (attn.query_slot_N + depth)[None], attn)[0]
        tokens_RK, parent_slot_RK = grower.expand(*hidden_topk(drafter, hidden_ND, K))
        parent_row_N = (torch.arange(R, device=device)[:, None] * K + parent_slot_RK).reshape(-1)
        cond_ND = hidden_ND[parent_row_N]
    cands = grower.candidates()
    return TreeCandidates(topk=cands.topk, steps=cands.steps, tokens_RC=cands.tokens_RC.cpu(),
                          scores_RC=cands.scores_RC.cpu(), parent_RC=cands.parent_RC.cpu(),
                          depth_C=cands.depth_C.cpu())

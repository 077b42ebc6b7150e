"""The incremental tree drafter: :class:`DrafterSession` growing SGLang's EAGLE tree over its KV cache.

Live counterpart of the batched offline growth (:mod:`tree_draft`); the tests check both give
the same trees, so offline tree acceptance equals live tree decoding. Per round:

* draft extend (:meth:`DrafterSession.extend`): the newly committed slots, with target taps;
* depth 1: the ``topk`` best tokens of the last slot's output (:class:`TreeGrower`);
* each further depth: the ``topk`` frontier nodes in one drafter call at position
  ``last slot + depth``, each fed its parent's pre-norm hidden state; they attend to the whole
  committed cache and to the tree nodes named by ``kv`` (``"sglang"``: the earlier occupants of
  the same frontier slot, as SGLang's draft KV cache is laid out; ``"ancestors"``: the node's own
  ancestors), kept in a side store, never in the committed cache;
* the ``num_draft_tokens - 1`` best candidates form the :class:`DraftTree` the target verifies.

Legend: K top-k, M tree nodes stored so far, L committed cache length, D drafter hidden,
H heads, Hk key/value heads, d head dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from osprey_train.evaluation.live_drafter import DrafterSession
from osprey_train.evaluation.tree_draft import KV_MODES
from osprey_train.evaluation.tree_growth import TreeCandidates, TreeGrower, node_topk, select_nodes
from osprey_train.evaluation.tree_shape import TreeShape
from osprey_train.evaluation.tree_verify import DraftTree
from osprey_train.models import KVCacheAttention
from osprey_train.models.attention import masked_attention

__all__ = ["TreeDrafterSession"]


class _TreeCacheAttention:
    """A depth's frontier queries over the committed cache, earlier tree nodes (``visible_KM``) and themselves."""

    def __init__(self, committed: KVCacheAttention) -> None:
        self.committed = committed
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.visible_KM: torch.Tensor | None = None

    def __call__(self, layer_idx: int, q_BHKd: torch.Tensor, k_BHkKd: torch.Tensor,
                 v_BHkKd: torch.Tensor) -> torch.Tensor:
        K = q_BHKd.shape[2]
        parts_k = [self.committed.keys[layer_idx]]
        parts_v = [self.committed.values[layer_idx]]
        if layer_idx in self.keys:
            parts_k.append(self.keys[layer_idx])
            parts_v.append(self.values[layer_idx])
        L = int(parts_k[0].shape[2])
        allowed_KS = torch.cat([torch.ones(K, L, dtype=torch.bool, device=q_BHKd.device),
                                self.visible_KM.to(q_BHKd.device),
                                torch.eye(K, dtype=torch.bool, device=q_BHKd.device)], dim=1)
        out = masked_attention(q_BHKd, torch.cat(parts_k + [k_BHkKd], 2), torch.cat(parts_v + [v_BHkKd], 2),
                               allowed_KS[None])
        self.keys[layer_idx] = torch.cat(parts_k[1:] + [k_BHkKd], 2)
        self.values[layer_idx] = torch.cat(parts_v[1:] + [v_BHkKd], 2)
        return out


class TreeDrafterSession(DrafterSession):
    """A drafter bound to one sequence, proposing SGLang-style draft trees (greedy)."""

    def __init__(self, drafter, *, kv: str = "sglang", **kwargs) -> None:
        if kv not in KV_MODES:
            raise ValueError(f"kv must be one of {KV_MODES}, got {kv!r}")
        super().__init__(drafter, **kwargs)
        self.kv = kv
        self.candidates: TreeCandidates | None = None

    @torch.no_grad()
    def propose_tree(self, ids: Sequence[int], new_taps_TLDt: torch.Tensor, shape: TreeShape) -> DraftTree:
        """Extend over the newly committed slots, grow the tree of ``shape``, return its verified nodes."""
        root_11D = self.extend(ids, new_taps_TLDt)
        last_slot = self.slots - 1
        K = shape.topk
        grower = TreeGrower(K, self.vocab.to_target)
        tokens_1K = grower.start(*node_topk(self.drafter.logits(root_11D[0]), K))
        attn = _TreeCacheAttention(self.attention)
        cond_KD = root_11D[0].expand(K, -1)
        history: list[list[int]] = [[] for _ in range(K)]  # tree-store rows each frontier slot sees
        for depth in range(1, shape.steps):
            M = (depth - 1) * K
            visible_KM = torch.zeros(K, M, dtype=torch.bool)
            for j, rows in enumerate(history):
                visible_KM[j, rows] = True
            attn.visible_KM = visible_KM
            position_1K = torch.full((1, K), last_slot + depth, dtype=torch.long, device=self.device)
            hidden_KD = self.drafter.forward_hidden(tokens_1K, cond_KD[None], position_1K, attn)[0]
            tokens_1K, parent_slot_1K = grower.expand(*node_topk(self.drafter.logits(hidden_KD), K))
            parents = parent_slot_1K[0].tolist()
            if self.kv == "sglang":  # slot j keeps its own entries, whoever occupies it next
                history = [rows + [M + j] for j, rows in enumerate(history)]
            else:  # a node sees its parent's ancestors and its parent
                history = [history[p] + [M + p] for p in parents]
            cond_KD = hidden_KD[parents]
        self.candidates = grower.candidates()  # every candidate of this round's tree (for inspection)
        return DraftTree.from_candidates(self.candidates, select_nodes(self.candidates, shape)[0])

"""Target-side tree verification: the draft tree, its attention mask, the greedy rule, KV compaction.

One verify round feeds the target ``[root, node_1 .. node_{n-1}]`` in one forward pass over its
KV cache, the root being the last committed token (``num_draft_tokens = n``):

* positions: the root at ``past`` (the number of cached tokens), a node of depth ``d`` at
  ``past + d``;
* attention (:func:`tree_attention_mask`): every new token sees the whole cache (the committed
  prefix), and among the new tokens exactly its ancestors and itself;
* greedy rule (:func:`verify_tree_greedy`): from the root, follow the child whose token equals
  the target's argmax at the current node; the emitted tokens are the path's tokens and the
  argmax after its last node (SGLang's ``verify_tree_greedy``);
* the cache then holds ``past + n`` entries; :func:`keep_path` compacts it to the prefix, the root
  and the accepted path (entries moved into consecutive slots), dropping the other branches. A
  node of depth ``d`` was computed at position ``past + d`` and lands at index ``past + d``, so the
  cache is exactly what sequential decoding of the accepted tokens would have produced.

Greedy only: SGLang's tree rejection sampling is not implemented.

Legend: n tree tokens (root + nodes), V vocabulary, L taps, Dt target hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from osprey_data.errors import ModelError
from osprey_train.evaluation.tree_growth import TreeCandidates

__all__ = ["DraftTree", "keep_path", "tree_attention_mask", "verify_tree_greedy"]


@dataclass
class DraftTree:
    """The verified draft nodes of one round, root excluded, in SGLang's (candidate) order."""

    tokens: list[int]
    """Target-vocabulary token of each node."""
    parents: list[int]
    """Each node's parent as an index into ``[root, *nodes]`` (0 = the root)."""
    depths: list[int]
    """Depth of each node (1 = a child of the root)."""

    @classmethod
    def from_candidates(cls, cands: TreeCandidates, selected_N: torch.Tensor) -> "DraftTree":
        """The tree of root 0 of ``cands`` made of the candidates ``selected_N`` (ascending)."""
        chosen = [int(c) for c in selected_N]
        where = {c: i + 1 for i, c in enumerate(chosen)}
        parents = []
        for c in chosen:
            parent = int(cands.parent_RC[0, c])
            assert parent < 0 or parent in where, "every selected node's parent is selected (tie rule)"
            parents.append(0 if parent < 0 else where[parent])
        return cls(tokens=[int(cands.tokens_RC[0, c]) for c in chosen], parents=parents,
                   depths=[int(cands.depth_C[c]) for c in chosen])

    def __len__(self) -> int:
        return len(self.tokens)

    def visible(self) -> torch.Tensor:
        """(n, n) bool over ``[root, *nodes]``: token i may attend to token j (j is i or an ancestor)."""
        n = len(self) + 1
        allowed = torch.eye(n, dtype=torch.bool)
        allowed[:, 0] = True
        for i, parent in enumerate(self.parents, start=1):
            assert parent < i, "parents come before their children"
            allowed[i] |= allowed[parent]
        return allowed


def tree_attention_mask(tree: DraftTree, past: int, *, dtype: torch.dtype, device) -> torch.Tensor:
    """4D additive mask (1, 1, n, past + n) for a target forward over ``[root, *nodes]``."""
    n = len(tree) + 1
    allowed = torch.cat([torch.ones(n, past, dtype=torch.bool), tree.visible()], dim=1)
    mask = torch.zeros(n, past + n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def verify_tree_greedy(tree: DraftTree, target_logits_nV: torch.Tensor) -> tuple[list[int], int]:
    """``(accepted path as node indices 1.., next token)``; row i of the logits is token i of ``[root, *nodes]``."""
    if target_logits_nV.shape[0] != len(tree) + 1:
        raise ValueError(f"need {len(tree) + 1} target rows for a tree of {len(tree)} nodes, "
                         f"got {target_logits_nV.shape[0]}")
    best = target_logits_nV.argmax(dim=-1).tolist()
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents, start=1):
        children.setdefault(parent, []).append(i)
    path, node = [], 0
    while True:
        nxt = [c for c in children.get(node, []) if tree.tokens[c - 1] == best[node]]
        if not nxt:
            return path, int(best[node])
        node = nxt[0]  # siblings carry distinct tokens (one parent's top-k)
        path.append(node)


def keep_path(target, past: int, path: Sequence[int]) -> None:
    """Compact the target's cache after a tree forward to ``past`` + root + the accepted ``path``.

    ``target`` is an :class:`~osprey_train.evaluation.spec_decode.HFTargetSession` whose cache holds
    ``past + n`` entries (the prefix, then the tree tokens in order).
    """
    layers = getattr(target.cache, "layers", None)
    if layers is None or any(getattr(layer, "is_sliding", False) for layer in layers):
        raise ModelError("tree verification needs a transformers DynamicCache without sliding-window layers "
                         "(e.g. Gemma-3 interleaves them); use chain drafting for this target")
    target.keep(past + 1, [past + i for i in path])

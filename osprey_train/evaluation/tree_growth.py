"""SGLang's EAGLE draft tree: growth by top-k expansion, selection of the verified nodes, greedy acceptance.

Pure tensor rules shared by offline tree acceptance (:mod:`tree_draft`, every root of a sample at
once) and live tree decoding (:mod:`tree_live_drafter`, one root): they decide which tokens the
drafter proposes, never how its hidden states are computed. Semantics of SGLang's EAGLE worker
(``select_top_k_tokens``, ``organize_draft_results``, ``build_tree_kernel_efficient`` and the greedy
tree verification), re-derived here:

* **Depth 1** (from the root, the drafter's output at the last committed slot): its ``topk`` most
  likely tokens; each candidate's score is its probability (softmax over the drafter's
  vocabulary, float32). They are the first frontier.
* **Depth d >= 2**: each of the ``topk`` frontier nodes proposes its own ``topk`` children; a
  child's score is its parent's score times its probability (cumulative probability of the
  path). All ``topk**2`` children are candidates; the ``topk`` best by score become the next
  frontier (the nodes the drafter runs at the next depth, fed their parent's hidden state).
* Candidates are numbered as SGLang lays them out: the ``topk`` depth-1 candidates, then per
  depth ``topk**2`` children ordered by (parent's frontier slot, child rank).
* **Selection**: the ``num_draft_tokens - 1`` best candidates of the depths ``<= steps`` by score,
  kept in candidate order; with the root (the last committed token) they are the verified tree.
* **Greedy verification**: from the root, follow the child whose token equals the target's
  greedy next token; the accepted path plus the target's token after its last node are emitted.

Ties (equal scores): SGLang calls ``torch.topk`` on the GPU, whose order among equal values is
unspecified. Here candidates with equal scores are ranked by candidate index (shallower first),
so a parent always outranks its children and every selected node's parent is selected (SGLang
prints "invalid eagle tree" and drops the node when a tie leaves a parent out). Within one node,
``topk == 1`` takes the first maximal logit (``argmax``, as chain drafting does) and ``topk > 1``
uses ``torch.topk`` on the logits (exact ties among a node's logits are left to it).

Legend: R roots (trees grown in parallel), K top-k, V drafter vocabulary, C candidates,
N selected nodes (num_draft_tokens - 1), S steps (depths).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from osprey_train.evaluation.tree_shape import TreeShape, max_draft_nodes

__all__ = ["TreeCandidates", "TreeGrower", "node_topk", "select_nodes", "accepted_depths", "rank_desc"]


def rank_desc(scores: Tensor) -> Tensor:
    """Indices sorting ``scores`` descending along the last dim, equal scores by index (stable)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices


def node_topk(logits_NV: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per row: the ``k`` most likely draft ids (N, k), best first, and their float32 probabilities."""
    logits_NV = logits_NV.float()
    if k == 1:
        ids_Nk = logits_NV.argmax(dim=-1, keepdim=True)
    else:
        ids_Nk = torch.topk(logits_NV, k, dim=-1).indices
    lse_N1 = torch.logsumexp(logits_NV, dim=-1, keepdim=True)
    return ids_Nk, torch.exp(logits_NV.gather(-1, ids_Nk) - lse_N1)


@dataclass
class TreeCandidates:
    """All candidate nodes of R trees grown to ``steps`` depths, in SGLang's candidate order."""

    topk: int
    steps: int
    tokens_RC: Tensor
    """Candidate tokens (target vocabulary ids)."""
    scores_RC: Tensor
    """Cumulative probability of each candidate's path (float32)."""
    parent_RC: Tensor
    """Candidate index of each candidate's parent; -1 for depth 1 (the root's children)."""
    depth_C: Tensor
    """Depth of every candidate (1 .. steps), the same for all roots."""

    def upto(self, steps: int) -> int:
        """Number of candidates of the depths ``<= steps`` (a prefix of the candidate order)."""
        return max_draft_nodes(steps, self.topk)


class TreeGrower:
    """Grows R trees depth by depth with SGLang's rules; the caller runs the drafter in between.

    ``start(*node_topk(root_logits, K))`` returns the first frontier; then, for each further depth,
    the caller runs the drafter on the frontier tokens (each fed the hidden state of the node at
    ``parent_slot`` of the previous frontier, or the root's at depth 1) and calls
    ``expand(*node_topk(frontier_logits, K))``. ``to_target`` maps draft ids to target ids (EAGLE-3).
    """

    def __init__(self, topk: int, to_target: Callable[[Tensor], Tensor] | None = None) -> None:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        self.topk = topk
        self.to_target = to_target or (lambda ids: ids)
        self.depth = 0
        self._tokens: list[Tensor] = []
        self._scores: list[Tensor] = []
        self._parents: list[Tensor] = []

    def start(self, ids_RK: Tensor, probs_RK: Tensor) -> Tensor:
        """Depth 1 from the roots' :func:`node_topk`; returns the first frontier's target tokens (R, K)."""
        tokens_RK = self.to_target(ids_RK)
        R, K = tokens_RK.shape
        self.scores_RK = probs_RK
        self.frontier_RK = torch.arange(K, device=tokens_RK.device).expand(R, K)  # candidate index
        self._tokens, self._scores = [tokens_RK], [probs_RK]
        self._parents = [torch.full((R, K), -1, dtype=torch.long, device=tokens_RK.device)]
        self.depth = 1
        return tokens_RK

    def expand(self, ids_NK: Tensor, probs_NK: Tensor) -> tuple[Tensor, Tensor]:
        """One more depth from the frontier's :func:`node_topk` (N = R*K rows, frontier order).

        Returns the new frontier's target tokens (R, K) and, per new frontier node, the slot of its
        parent in the previous frontier (R, K): the row whose hidden state it is fed.
        """
        if self.depth < 1:
            raise RuntimeError("TreeGrower.expand before start")
        K = self.topk
        R = self.scores_RK.shape[0]
        tokens_RKK = self.to_target(ids_NK).reshape(R, K * K)
        expand_RKK = (self.scores_RK[:, :, None] * probs_NK.reshape(R, K, K)).reshape(R, K * K)
        base = K + (self.depth - 1) * K * K  # candidate index of this depth's first child
        chosen_RK = rank_desc(expand_RKK)[:, :K]
        self._tokens.append(tokens_RKK)
        self._scores.append(expand_RKK)
        self._parents.append(self.frontier_RK.repeat_interleave(K, dim=1))
        self.scores_RK = expand_RKK.gather(1, chosen_RK)
        self.frontier_RK = base + chosen_RK
        self.depth += 1
        return tokens_RKK.gather(1, chosen_RK), torch.div(chosen_RK, K, rounding_mode="floor")

    def candidates(self) -> TreeCandidates:
        """Every candidate grown so far (depths 1 .. ``self.depth``)."""
        if self.depth < 1:
            raise RuntimeError("TreeGrower.candidates before start")
        K = self.topk
        depth_C = torch.cat([torch.ones(K, dtype=torch.long)]
                            + [torch.full((K * K,), d, dtype=torch.long) for d in range(2, self.depth + 1)])
        return TreeCandidates(topk=K, steps=self.depth, tokens_RC=torch.cat(self._tokens, 1),
                              scores_RC=torch.cat(self._scores, 1), parent_RC=torch.cat(self._parents, 1),
                              depth_C=depth_C.to(self._tokens[0].device))


def select_nodes(cands: TreeCandidates, shape: TreeShape) -> Tensor:
    """Candidate indices of the verified nodes (R, num_draft_tokens - 1), ascending (SGLang's order).

    The ``num_draft_tokens - 1`` best candidates of the depths ``<= shape.steps``.
    """
    if shape.topk != cands.topk or shape.steps > cands.steps:
        raise ValueError(f"tree {shape.label} needs candidates of topk {shape.topk} grown to {shape.steps} "
                         f"depths; got topk {cands.topk}, {cands.steps} depths")
    upto = cands.upto(shape.steps)
    chosen_RN = rank_desc(cands.scores_RC[:, :upto])[:, :shape.num_draft_tokens - 1]
    return torch.sort(chosen_RN, dim=-1).values


def accepted_depths(cands: TreeCandidates, selected_RN: Tensor, expected_RS: Tensor) -> Tensor:
    """Greedy acceptance per root: depth of the deepest selected node whose path is accepted (R,).

    ``expected_RS[r, d - 1]`` is the target's greedy token at depth ``d`` below root ``r`` (-1 where
    there is none, e.g. past the end of a stored response). A node is accepted when it is
    selected, its token is the expected one at its depth and its parent is accepted (or is the
    root): the path greedy verification walks.
    """
    R, C = cands.tokens_RC.shape
    depth_C = cands.depth_C
    steps = int(depth_C.max())
    if expected_RS.shape[1] < steps:
        pad = expected_RS.new_full((R, steps - expected_RS.shape[1]), -1)
        expected_RS = torch.cat([expected_RS, pad], dim=1)
    selected_RC = torch.zeros(R, C, dtype=torch.bool, device=selected_RN.device)
    selected_RC.scatter_(1, selected_RN, True)
    match_RC = selected_RC & (cands.tokens_RC == expected_RS[:, depth_C - 1])
    accepted_RC = torch.zeros_like(match_RC)
    for d in range(1, steps + 1):  # parents lie at the previous depth, decided one loop earlier
        cols = (depth_C == d).nonzero().flatten()
        parent_RX = cands.parent_RC[:, cols]
        parent_ok = torch.where(parent_RX < 0, torch.ones_like(parent_RX, dtype=torch.bool),
                                accepted_RC.gather(1, parent_RX.clamp(min=0)))
        accepted_RC[:, cols] = match_RC[:, cols] & parent_ok
    return (accepted_RC.long() * depth_C).amax(dim=1) if C else torch.zeros(R, dtype=torch.long)

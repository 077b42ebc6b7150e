"""Offline acceptance length of tree drafting (SGLang's EAGLE ``steps, topk, num_draft_tokens``) on a store.

The chain simulation of :mod:`acceptance` generalized to draft trees, exact for greedy
verification on a store holding the target's greedy responses. Per verify round (rounds counted as
SGLang counts them, :func:`~osprey_train.evaluation.acceptance.walk_rounds`):

* the drafter grows its tree from the round's root slot as SGLang's EAGLE worker does
  (:mod:`tree_growth`: top-k expansion per depth, the drafter's own hidden states fed along each
  branch, target features for the committed prefix; :mod:`tree_draft` for the drafter passes);
* the ``num_draft_tokens - 1`` best candidates by cumulative draft probability are verified;
* accepted = the longest root path of verified nodes equal to the stored continuation; the round
  emits it plus the target's own next token.

Several shapes are evaluated in one pass over the store: the growth for one ``topk`` does not
depend on ``num_draft_tokens``, and growing to ``steps`` depths grows every shallower tree on the
way, so one growth per distinct ``topk`` (to the largest ``steps`` asked with it) serves every
shape with that ``topk``. With ``topk = 1, num_draft_tokens = steps + 1`` the figures equal
:func:`~osprey_train.evaluation.acceptance.evaluate_acceptance`'s exactly (tested).

``run(TreeAcceptanceConfig)`` is ``osprey eval acceptance --tree S,K,N [--tree ...]``. Which of
SGLang's behaviours are modelled and which are not: ``docs/evaluation.md``.

Legend: T tokens, R roots, S steps, C candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from osprey_data.cpu_threads import note_to_stderr, torch_threads
from osprey_data.errors import ConfigError
from osprey_train.evaluation.acceptance import (
    AcceptanceConfig,
    AcceptanceReport,
    RoundTally,
    greedy_consistency_counts,
    has_verify_round,
    load_drafter_and_store,
    require_tree_drafting,
    store_verdict,
    walk_rounds,
)
from osprey_train.evaluation.tree_draft import KV_MODES, draft_prefix, grow_trees, round_roots
from osprey_train.evaluation.tree_growth import TreeCandidates, accepted_depths, select_nodes
from osprey_train.evaluation.tree_shape import TreeShape

__all__ = ["TreeAcceptanceConfig", "evaluate_tree_acceptance", "expected_continuations", "run", "tree_walk"]


def expected_continuations(token_ids_T: torch.Tensor, roots_R: torch.Tensor, steps: int) -> torch.Tensor:
    """``out[r, d - 1]`` = stored token at depth ``d`` below root slot ``roots[r]`` (``x_{q+1+d}``), -1 past the end."""
    T = int(token_ids_T.shape[0])
    idx_RS = roots_R[:, None].long() + 1 + torch.arange(1, steps + 1)[None]
    padded = torch.cat([token_ids_T.long().cpu(), torch.full((steps + 1,), -1, dtype=torch.long)])
    return padded[idx_RS.clamp(max=T + steps)]


def tree_walk(token_ids_T: torch.Tensor, prompt_length: int, roots_R: torch.Tensor, cands: TreeCandidates,
              shape: TreeShape) -> list[tuple[int, int, int]]:
    """The verify rounds of one sample drafted with trees of ``shape`` (see :func:`walk_rounds`)."""
    expected_RS = expected_continuations(token_ids_T, roots_R, shape.steps)
    accepted_R = accepted_depths(cands, select_nodes(cands, shape), expected_RS).tolist()
    first = int(roots_R[0]) if len(roots_R) else 0
    return walk_rounds(int(token_ids_T.shape[0]), prompt_length, lambda q: accepted_R[q - first], shape.steps)


@torch.no_grad()
def evaluate_tree_acceptance(drafter, reader, shapes: Sequence[TreeShape], *, kv: str = "sglang",
                             max_samples: int | None = None, progress: bool = True) -> list[AcceptanceReport]:
    """Simulate greedy tree speculative decoding for every shape; one report per shape, in order."""
    if not shapes:
        raise ConfigError("tree acceptance: give at least one tree shape")
    require_tree_drafting(drafter, "tree acceptance")
    if kv not in KV_MODES:
        raise ConfigError(f"tree acceptance: draft KV mode must be one of {KV_MODES}, got {kv!r}")
    depth_by_topk: dict[int, int] = {}
    for shape in shapes:
        depth_by_topk[shape.topk] = max(depth_by_topk.get(shape.topk, 0), shape.steps)
    was_training = drafter.training
    drafter.eval()
    n = len(reader) if not max_samples else min(max_samples, len(reader))
    tallies = [RoundTally() for _ in shapes]
    consistent = checked = 0
    for i in tqdm(range(n), desc="tree acceptance", unit="sample", disable=not progress):
        s = reader.sample(i, as_torch=True)
        if not has_verify_round(s):
            continue
        T = int(s.token_ids.shape[0])
        roots_R = torch.tensor(list(round_roots(T, s.prompt_length)), dtype=torch.long)
        prefix = draft_prefix(drafter, s.token_ids, s.hidden_TLD)
        for topk, steps in depth_by_topk.items():
            cands = grow_trees(drafter, s.token_ids, s.hidden_TLD, roots_R, topk=topk, steps=steps, kv=kv,
                               prefix=prefix)
            for shape, tally in zip(shapes, tallies):
                if shape.topk == topk:
                    tally.add(s.domain, tree_walk(s.token_ids, s.prompt_length, roots_R, cands, shape))
        c, k = greedy_consistency_counts(s)
        consistent, checked = consistent + c, checked + k
    drafter.train(was_training)
    consistency, reason = store_verdict(reader.header, consistent, checked)
    store = getattr(reader, "url", None)
    return [tally.report(shape.steps, consistency=consistency, reason=reason, store=store,
                         tree={**shape.to_dict(), "kv": kv})
            for shape, tally in zip(shapes, tallies)]


@dataclass(kw_only=True)
class TreeAcceptanceConfig(AcceptanceConfig):
    """Options of ``osprey eval acceptance --tree S,K,N [--tree ...]``."""

    trees: tuple[TreeShape, ...]
    """Tree shapes to evaluate (``steps`` of the base options is not used)."""
    draft_kv: str = "sglang"
    """Which earlier tree nodes a drafted node attends to: 'sglang' (as served) or 'ancestors'."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.trees = tuple(self.trees)
        if not self.trees:
            raise ConfigError("acceptance: give at least one --tree STEPS,TOPK,NUM_DRAFT_TOKENS")
        if self.draft_kv not in KV_MODES:
            raise ConfigError(f"acceptance: --draft-kv must be one of {KV_MODES}, got {self.draft_kv!r}")
        if self.temperature > 0:
            raise ConfigError(f"acceptance: --tree with --temperature {self.temperature:g}: {TREE_SAMPLING_REASON}; "
                              "use --steps S for a chain")


TREE_SAMPLING_REASON = ("the sampled estimator is exact for chain rejection sampling only; a tree is verified at "
                        "temperature > 0 by a multi-draft rule that accepts differently")


def run(cfg: TreeAcceptanceConfig) -> list[AcceptanceReport]:
    """Load the drafter and store, check they belong together, simulate every tree shape."""
    drafter, reader = load_drafter_and_store(cfg.drafter, cfg.store, device=cfg.device)
    with torch_threads(cfg.threads, note_to_stderr if cfg.progress else None):
        return evaluate_tree_acceptance(drafter, reader, cfg.trees, kv=cfg.draft_kv,
                                        max_samples=cfg.max_samples or None, progress=cfg.progress)

"""Tree speculative decoding (greedy): SGLang's EAGLE rounds with a drafted tree verified in one target pass.

The loop of :func:`~osprey_train.evaluation.spec_decode.speculative_generate` with a tree per
round: the prefill yields the first response token; each round the drafter proposes the
``num_draft_tokens - 1`` nodes of its tree (:class:`TreeDrafterSession`), the target scores
``[last committed, *nodes]`` with a tree attention mask (:mod:`tree_verify`), the accepted path
plus the target's next token are emitted (cut at EOS and the token budget), the target's cache is
compacted to the accepted path and the drafter receives the target's taps of the emitted
positions. Greedy verification reproduces plain greedy decoding token for token.

The tree is always drafted whole, even near the token budget (SGLang does the same; what lies
beyond the budget is cut), so the trees equal those offline tree acceptance grows on a store.

Legend: n tree tokens, V target vocabulary, L taps, Dt target hidden.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from osprey_data.errors import ModelError
from osprey_train.evaluation.row_exact_attention import ROW_EXACT
from osprey_train.evaluation.spec_decode import GenerationResult, HFTargetSession, cut_emitted, prefill
from osprey_train.evaluation.tree_live_drafter import TreeDrafterSession
from osprey_train.evaluation.tree_shape import TreeShape
from osprey_train.evaluation.tree_verify import keep_path, tree_attention_mask, verify_tree_greedy

__all__ = ["check_tree_target", "tree_speculative_generate"]


def check_tree_target(target: HFTargetSession) -> None:
    """Refuse targets whose attention cannot take a custom tree mask or whose cache cannot be compacted."""
    impl = getattr(target.model.config, "_attn_implementation", "eager")
    if impl not in ("eager", "sdpa", ROW_EXACT):
        raise ModelError(f"tree verification needs the target's attention to accept a custom mask (eager or "
                         f"sdpa); this target runs {impl!r}")
    if any(t != "full_attention" for t in getattr(target.model.config, "layer_types", None) or []):
        raise ModelError("tree verification needs a target without sliding-window layers; use chain drafting")


@torch.no_grad()
def tree_speculative_generate(target: HFTargetSession, drafter: TreeDrafterSession, prompt_ids: Sequence[int], *,
                              shape: TreeShape, max_new_tokens: int,
                              eos_ids: Sequence[int] = ()) -> GenerationResult:
    """Generate greedily with tree speculative decoding; ``drafted`` holds the tree depth per round."""
    check_tree_target(target)
    eos = frozenset(int(i) for i in eos_ids)
    start = time.perf_counter()
    ids, result, new_taps_TLDt = prefill(target, drafter, prompt_ids, eos=eos,
                                         capacity=len(prompt_ids) + max_new_tokens + shape.num_draft_tokens)
    while result.finish_reason != "stop" and len(result.output_ids) < max_new_tokens:
        room = max_new_tokens - len(result.output_ids)
        tree = drafter.propose_tree(ids, new_taps_TLDt, shape)
        past = target.length
        mask = tree_attention_mask(tree, past, dtype=target.model.dtype, device=target.device)
        logits_nV, taps_nLDt = target.forward([ids[-1], *tree.tokens], want_taps=True,
                                              positions=[past] + [past + d for d in tree.depths],
                                              attention_mask=mask)
        path, next_id = verify_tree_greedy(tree, logits_nV)
        new_ids, stopped = cut_emitted([tree.tokens[i - 1] for i in path] + [next_id], eos, room)
        ids.extend(new_ids)
        result.add_round(new_ids, drafted=min(shape.steps, room), accepted=len(path))
        keep_path(target, past, path)
        target.crop(len(ids) - 1)
        new_taps_TLDt = taps_nLDt[[0, *path]][: len(new_ids)]
        if stopped:
            result.finish_reason = "stop"
            break
    result.seconds = time.perf_counter() - start
    result.target_forwards = target.forwards
    return result

"""Offline tree drafting against a brute-force reference, and tree acceptance at topk = 1 against the chain.

The reference below enumerates SGLang's EAGLE tree naively, one root at a time, without any of our
tree code (only the drafter network: ``fuse_taps``, ``forward_hidden`` with plain causal attention
over an explicit input list, ``logits``):

* the root is the drafter's output at the last committed slot, run over the whole prefix (the
  draft extend; its top-k are SGLang's ``spec_info.topk_p/topk_index``);
* every frontier node is run over its full explicit context: the prefix slots, then the nodes its
  KV entries belong to (its ancestors, or in SGLang's layout the nodes that held the same
  frontier slot at earlier depths: ``generate_draft_decode_kv_indices`` gives slot ``j`` at step
  ``i`` the prefix plus ``out_cache_loc[j, 0..i]``, and ``select_top_k_tokens`` reorders only the
  hidden states, never those entries), then itself, each fed its parent's hidden state;
* children: the ``topk`` most probable tokens of a node, score = parent score x probability
  (float32, ``expand_scores``); frontier = the ``topk`` best children (equal scores: lower
  candidate index first);
* kept nodes = the ``num_draft_tokens - 1`` best candidates (``organize_draft_results``);
  acceptance walks the kept children matching the stored continuation (``verify_tree_greedy``).

A causal pass over such an explicit list computes each context node's keys exactly as they were
computed when that node was drafted (its own context is the list before it), so this is what a
KV-cached engine computes.
"""

from __future__ import annotations

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.evaluation.tree_acceptance import evaluate_tree_acceptance, expected_continuations, tree_walk
from osprey_train.evaluation.tree_draft import grow_trees, round_roots
from osprey_train.evaluation.tree_growth import TreeCandidates, accepted_depths, select_nodes
from osprey_train.evaluation.tree_shape import TreeShape, max_draft_nodes, parse_tree_shape
from osprey_train.models import CausalAttention
from tests.train.evaluation.store_util import make_layout_setup


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_tokenizer_dir):
    return make_layout_setup(tmp_path_factory.mktemp("tree_draft"), tiny_tokenizer_dir)


class NaiveTree:
    """SGLang's tree for one root, enumerated node by node with explicit contexts."""

    def __init__(self, drafter, token_ids, taps, q, topk, steps, kv):
        self.drafter, self.topk = drafter, topk
        ids = [int(t) for t in token_ids]
        conds = list(drafter.fuse_taps(taps[None, :q + 1].float())[0])
        prefix = [(ids[j + 1], conds[j], j) for j in range(q + 1)]  # slot j: (x_{j+1}, c_j) at j
        root_h = self._run(prefix)
        # candidate: token, score (float32 tensor), parent candidate (-1 = root), depth
        self.cands: list[dict] = []
        frontier = []
        for rank, (tok, p) in enumerate(self._children(root_h)):
            self.cands.append(dict(token=tok, score=p, parent=-1, depth=1))
            frontier.append(dict(cand=rank, token=tok, cond=root_h, context=[]))
        for depth in range(2, steps + 1):
            children = []
            for j, node in enumerate(frontier):
                entry = (node["token"], node["cond"], q + depth - 1)
                h = self._run(prefix + node["context"] + [entry])
                own = node["context"] + [entry]
                for tok, p in self._children(h):
                    children.append(dict(token=tok, score=self.cands[node["cand"]]["score"] * p,
                                         parent=node["cand"], depth=depth, hidden=h, own=own, slot=j))
            base = len(self.cands)
            self.cands += [{k: c[k] for k in ("token", "score", "parent", "depth")} for c in children]
            order = sorted(range(len(children)), key=lambda i: (-float(children[i]["score"]), i))[:topk]
            slot_context = [node["context"] + [(node["token"], node["cond"], q + depth - 1)] for node in frontier]
            frontier = [dict(cand=base + i, token=children[i]["token"], cond=children[i]["hidden"],
                             context=children[i]["own"] if kv == "ancestors" else slot_context[s])
                        for s, i in enumerate(order)]

    def _run(self, context):
        ids = torch.tensor([[t for t, _, _ in context]])
        conds = torch.stack([c for _, c, _ in context])[None]
        pos = torch.tensor([[p for _, _, p in context]])
        return self.drafter.forward_hidden(ids, conds, pos, CausalAttention())[0, -1]

    def _children(self, h):
        probs = torch.softmax(self.drafter.logits(h[None])[0].float(), dim=-1)
        values = probs.tolist()
        best = sorted(range(len(values)), key=lambda t: (-values[t], t))[:self.topk]
        d2t = self.drafter.draft_to_target
        return [(t if d2t is None else int(d2t[t]), probs[t]) for t in best]

    def kept(self, shape):
        pool = [i for i, c in enumerate(self.cands) if c["depth"] <= shape.steps]
        return sorted(sorted(pool, key=lambda i: (-float(self.cands[i]["score"]), i))[:shape.num_draft_tokens - 1])

    def accepted(self, shape, continuation):
        kept, cur, depth = set(self.kept(shape)), -1, 0
        while depth < len(continuation):
            nxt = [i for i in kept if self.cands[i]["parent"] == cur and self.cands[i]["token"] == continuation[depth]]
            if not nxt:
                break
            cur, depth = nxt[0], depth + 1
        return depth


SHAPES = [TreeShape(steps=3, topk=2, num_draft_tokens=5), TreeShape(steps=3, topk=3, num_draft_tokens=8),
          TreeShape(steps=2, topk=3, num_draft_tokens=4), TreeShape(steps=1, topk=2, num_draft_tokens=3)]


@pytest.mark.parametrize("arch", ["osprey-random", "eagle3-random"])
@pytest.mark.parametrize("kv", ["sglang", "ancestors"])
@torch.no_grad()
def test_batched_tree_growth_equals_brute_force(setup, arch, kv):
    reader, drafters = setup
    drafter = drafters[arch]
    s = reader.sample(1, as_torch=True)
    taps, ids = s.hidden_TLD.float(), s.token_ids
    roots = torch.tensor(list(round_roots(len(ids), s.prompt_length)))
    cands = grow_trees(drafter, ids, taps, roots, topk=3, steps=3, kv=kv)
    cands2 = grow_trees(drafter, ids, taps, roots, topk=2, steps=3, kv=kv)
    assert cands.tokens_RC.shape == (len(roots), max_draft_nodes(3, 3))
    checked = set()
    for r in (0, len(roots) // 2, len(roots) - 1):
        q = int(roots[r])
        for c, topk in ((cands, 3), (cands2, 2)):
            naive = NaiveTree(drafter, ids, taps, q, topk, 3, kv)
            assert c.tokens_RC[r].tolist() == [x["token"] for x in naive.cands], (q, topk)
            assert c.parent_RC[r].tolist() == [x["parent"] for x in naive.cands], (q, topk)
            torch.testing.assert_close(c.scores_RC[r], torch.stack([x["score"] for x in naive.cands]),
                                       rtol=1e-5, atol=1e-7)
            continuation = ids[q + 2: q + 2 + 3].tolist()
            for shape in SHAPES:
                if shape.topk != topk:
                    continue
                sel = select_nodes(c, shape)
                assert sel[r].tolist() == naive.kept(shape), (q, shape)
                expected = expected_continuations(ids, roots, shape.steps)
                assert int(accepted_depths(c, sel, expected)[r]) == naive.accepted(shape, continuation[:shape.steps])
                checked.add(shape)
    assert len(checked) == len(SHAPES)


@torch.no_grad()
def test_sglang_kv_layout_differs_from_exact_ancestors(setup):
    """Not vacuous: with topk > 1 the two draft-KV layouts give other trees somewhere."""
    reader, drafters = setup
    s = reader.sample(0, as_torch=True)
    roots = torch.tensor(list(round_roots(len(s.token_ids), s.prompt_length)))
    a = grow_trees(drafters["osprey-random"], s.token_ids, s.hidden_TLD, roots, topk=3, steps=4, kv="sglang")
    b = grow_trees(drafters["osprey-random"], s.token_ids, s.hidden_TLD, roots, topk=3, steps=4, kv="ancestors")
    assert torch.equal(a.tokens_RC[:, :3 + 9], b.tokens_RC[:, :3 + 9])  # depths 1-2 see the same entries
    assert not torch.equal(a.scores_RC, b.scores_RC)


@pytest.mark.parametrize("arch", ["osprey-distilled", "eagle3-random"])
@pytest.mark.parametrize("steps", [1, 3])
def test_topk1_tree_equals_chain_simulation(setup, arch, steps):
    reader, drafters = setup
    chain = evaluate_acceptance(drafters[arch], reader, steps=steps, progress=False)
    [tree] = evaluate_tree_acceptance(drafters[arch], reader, [TreeShape.chain(steps)], progress=False)
    assert tree.tree == {"steps": steps, "topk": 1, "num_draft_tokens": steps + 1, "kv": "sglang"}
    tree.tree = None
    assert tree.to_dict() == chain.to_dict()
    if arch == "osprey-distilled" and steps == 3:
        assert 0 < chain.per_position[0] < 1  # not vacuous: drafts accepted and rejected


def test_several_shapes_in_one_pass_equal_separate_runs(setup):
    reader, drafters = setup
    shapes = [TreeShape(steps=3, topk=2, num_draft_tokens=5), TreeShape(steps=2, topk=2, num_draft_tokens=3),
              TreeShape.chain(2)]
    together = evaluate_tree_acceptance(drafters["osprey-distilled"], reader, shapes, progress=False)
    for shape, rep in zip(shapes, together):
        [alone] = evaluate_tree_acceptance(drafters["osprey-distilled"], reader, [shape], progress=False)
        assert rep.to_dict() == alone.to_dict()
    assert together[0].overall >= together[2].overall  # a 4-node tree of depth 3 vs a 2-draft chain


def _cands(scores, parents, topk, steps, tokens=None):
    scores = torch.tensor([scores], dtype=torch.float32)
    C = scores.shape[1]
    depth = torch.tensor([1] * topk + [d for d in range(2, steps + 1) for _ in range(topk * topk)])
    return TreeCandidates(topk=topk, steps=steps, tokens_RC=torch.tensor([tokens or list(range(10, 10 + C))]),
                          scores_RC=scores, parent_RC=torch.tensor([parents]), depth_C=depth)


def test_selection_ties_keep_parents_and_walk_stops_at_unkept_nodes():
    # topk 2, 2 depths: candidates 0,1 (depth 1), 2,3 children of 0, 4,5 children of 1
    c = _cands([0.5, 0.5, 0.5, 0.1, 0.2, 0.2], [-1, -1, 0, 0, 1, 1], 2, 2)
    # ties at 0.5: candidate order decides (the parent 0 before its child 2)
    assert select_nodes(c, TreeShape(steps=2, topk=2, num_draft_tokens=3)).tolist() == [[0, 1]]
    assert select_nodes(c, TreeShape(steps=2, topk=2, num_draft_tokens=4)).tolist() == [[0, 1, 2]]
    sel = select_nodes(c, TreeShape(steps=2, topk=2, num_draft_tokens=4))
    # the continuation follows 1 -> 4, but 4 is not kept: one draft accepted
    assert accepted_depths(c, sel, torch.tensor([[11, 14]])).tolist() == [1]
    assert accepted_depths(c, sel, torch.tensor([[10, 12]])).tolist() == [2]
    assert accepted_depths(c, sel, torch.tensor([[13, 12]])).tolist() == [0]  # 13 is a depth-2 token
    assert accepted_depths(c, sel, torch.tensor([[10, -1]])).tolist() == [1]  # nothing past the end


def test_tree_shapes_follow_sglang_rules():
    assert parse_tree_shape("5,4,8") == (TreeShape(steps=5, topk=4, num_draft_tokens=8), None)
    shape, note = parse_tree_shape("3,1,8")
    assert shape == TreeShape.chain(3) and "adjusts" in note
    assert max_draft_nodes(3, 2) == 2 + 2 * 4
    with pytest.raises(ConfigError, match="at most 11"):
        TreeShape(steps=3, topk=2, num_draft_tokens=12)
    with pytest.raises(ConfigError, match="STEPS,TOPK"):
        parse_tree_shape("5,4")
    with pytest.raises(ConfigError, match="num_draft_tokens must be >= 2"):
        TreeShape(steps=2, topk=2, num_draft_tokens=1)
    assert TreeShape(steps=5, topk=4, num_draft_tokens=8).sglang_flags()[-1] == "8"


def test_walk_uses_kept_tree_per_round(setup):
    reader, drafters = setup
    s = reader.sample(2, as_torch=True)
    roots = torch.tensor(list(round_roots(len(s.token_ids), s.prompt_length)))
    c = grow_trees(drafters["osprey-distilled"], s.token_ids, s.hidden_TLD, roots, topk=2, steps=3)
    walk = tree_walk(s.token_ids, s.prompt_length, roots, c, TreeShape(steps=3, topk=2, num_draft_tokens=6))
    assert sum(y for _, y, _ in walk) == len(s.token_ids) - s.prompt_length - 1

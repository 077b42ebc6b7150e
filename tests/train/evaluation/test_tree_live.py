"""Live tree decoding: lossless against plain greedy decoding, and equal to offline tree acceptance."""

from __future__ import annotations

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_data.store import StoreReader
from osprey_train.evaluation.live import LiveConfig, run
from osprey_train.evaluation.spec_decode import HFTargetSession, plain_generate
from osprey_train.evaluation.tree_acceptance import evaluate_tree_acceptance
from osprey_train.evaluation.tree_decode import tree_speculative_generate
from osprey_train.evaluation.tree_draft import grow_trees, round_roots
from osprey_train.evaluation.tree_growth import select_nodes
from osprey_train.evaluation.tree_live_drafter import TreeDrafterSession
from osprey_train.evaluation.tree_shape import TreeShape
from osprey_train.evaluation.tree_verify import DraftTree, tree_attention_mask, verify_tree_greedy
from osprey_train.models import load_drafter
from tests.helpers.tiny_store import TINY_PROMPTS
from tests.train.evaluation.store_util import make_live_setup

MAX_NEW = 16


@pytest.fixture(scope="module")
def live_setup(tmp_path_factory, tiny_llama_dir):
    return make_live_setup(tmp_path_factory.mktemp("tree_live"), tiny_llama_dir, max_new_tokens=MAX_NEW)


def _config(setup, **kw):
    base = dict(drafter=str(setup["drafter"]), target=str(setup["target"]), inputs=(str(setup["prompts"]),),
                max_new_tokens=MAX_NEW, device="cpu", progress=False, threads=1)
    return LiveConfig(**{**base, **kw})


@pytest.mark.parametrize("shape,kv", [(TreeShape(steps=3, topk=2, num_draft_tokens=6), "sglang"),
                                      (TreeShape(steps=2, topk=4, num_draft_tokens=8), "ancestors")])
def test_offline_tree_acceptance_equals_live_tree_decoding(live_setup, shape, kv):
    reader = StoreReader(str(live_setup["store"]))
    [offline] = evaluate_tree_acceptance(load_drafter(live_setup["drafter"]), reader, [shape], kv=kv,
                                         progress=False)
    live = run(_config(live_setup, tree=shape, draft_kv=kv, tap_codec="bf16"))  # the store keeps bf16 taps
    assert live.greedy_identical == live.num_prompts == len(TINY_PROMPTS)  # lossless
    assert live.tree == {**shape.to_dict(), "kv": kv}
    assert offline.num_tokens == live.verify_tokens and offline.num_verify_steps == live.verify_steps
    assert offline.overall == pytest.approx(live.acceptance_length, abs=1e-12)
    assert offline.per_position == pytest.approx(live.per_position, abs=1e-12)
    for domain, value in offline.per_domain.items():
        assert value == pytest.approx(live.per_domain[domain]["acceptance_length"], abs=1e-12)
    assert live.acceptance_length > 1.0  # not vacuous: drafts accepted


def test_live_tree_drafter_equals_batched_offline_growth(live_setup):
    """Round by round, the incremental drafter grows the trees the batched offline code grows."""
    reader = StoreReader(str(live_setup["store"]))
    drafter = load_drafter(live_setup["drafter"])
    shape = TreeShape(steps=3, topk=3, num_draft_tokens=9)
    for kv in ("sglang", "ancestors"):
        s = reader.sample(0, as_torch=True)
        ids, taps = s.token_ids.tolist(), s.hidden_TLD.float()
        roots = torch.tensor(list(round_roots(len(ids), s.prompt_length)))
        cands = grow_trees(drafter, s.token_ids, taps, roots, topk=3, steps=3, kv=kv)
        selected = select_nodes(cands, shape)
        session = TreeDrafterSession(drafter, kv=kv)
        for r, q in enumerate(roots.tolist()):  # x_0 .. x_{q+1} committed: the taps of slots not fed yet
            tree = session.propose_tree(ids[:q + 2], taps[q:q + 1] if r else taps[:q + 1], shape)
            assert tree.tokens == cands.tokens_RC[r, selected[r]].tolist(), (kv, q)
            assert session.candidates.tokens_RC[0].tolist() == cands.tokens_RC[r].tolist(), (kv, q)
            torch.testing.assert_close(session.candidates.scores_RC[0], cands.scores_RC[r], rtol=1e-4, atol=1e-6)


class ScriptedTreeDrafter:
    """Proposes a fixed-shape tree whose second depth-1 branch is the target's greedy continuation."""

    def __init__(self, reference: list[int], prompt_len: int, vocab: int) -> None:
        self.reference, self.prompt_len, self.vocab = reference, prompt_len, vocab
        self.received: list[int] = []

    def reset(self) -> None:
        self.received = []

    def propose_tree(self, ids, new_taps_TLDt, shape) -> DraftTree:
        self.received.append(int(new_taps_TLDt.shape[0]))
        k = len(ids) - self.prompt_len
        right = [self.reference[k + i] if k + i < len(self.reference) else 0 for i in range(3)]
        wrong = [(t + 1) % self.vocab for t in right]
        # root -> 1 (wrong), 2 (right); 1 -> 3 (wrong); 2 -> 4 (wrong), 5 (right); 5 -> 6 (right)
        return DraftTree(tokens=[wrong[0], right[0], wrong[1], wrong[1], right[1], right[2]],
                         parents=[0, 0, 1, 2, 2, 5], depths=[1, 1, 2, 2, 2, 3])


def test_tree_verification_is_lossless_and_compacts_the_cache(tiny_llama_dir):
    """An always-right branch that is not the first: 4 tokens per round, outputs equal plain greedy."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    target = HFTargetSession(model, (2, 3))
    vocab = model.config.vocab_size
    for prompt in ([5, 17, 42, 99, 3], [250, 7, 7, 1]):
        reference = plain_generate(target, prompt, max_new_tokens=14).output_ids
        drafter = ScriptedTreeDrafter(reference, len(prompt), vocab)
        res = tree_speculative_generate(target, drafter, prompt, max_new_tokens=14,
                                        shape=TreeShape(steps=3, topk=2, num_draft_tokens=7))
        assert res.output_ids == reference
        assert res.accept_lengths == [4, 4, 4, 1]  # 13 tokens after the prefill's; the budget cuts the last
        assert drafter.received[0] == len(prompt) and drafter.received[1:] == [4, 4, 4]
        assert target.length == len(prompt) + len(reference) - 1


def test_tree_mask_and_greedy_rule():
    tree = DraftTree(tokens=[7, 8, 9], parents=[0, 0, 1], depths=[1, 1, 2])
    assert tree.visible().tolist() == [[True, False, False, False], [True, True, False, False],
                                       [True, False, True, False], [True, True, False, True]]
    mask = tree_attention_mask(tree, 2, dtype=torch.float32, device="cpu")
    assert mask.shape == (1, 1, 4, 6) and bool((mask[0, 0, :, :2] == 0).all())
    assert float(mask[0, 0, 3, 4]) < -1e30 and float(mask[0, 0, 3, 3]) == 0.0
    logits = torch.full((4, 12), -1.0)
    for row, best in enumerate([7, 9, 0, 11]):  # root -> 7 (node 1) -> 9 (node 3) -> 11
        logits[row, best] = 1.0
    assert verify_tree_greedy(tree, logits) == ([1, 3], 11)
    logits[0] = -1.0
    logits[0, 8] = 1.0  # root -> 8 (node 2), whose argmax 0 has no child
    assert verify_tree_greedy(tree, logits) == ([2], 0)


def test_tree_live_options(live_setup):
    with pytest.raises(ConfigError, match="greedily"):
        _config(live_setup, tree=TreeShape(steps=2, topk=2, num_draft_tokens=4), temperature=0.5)
    with pytest.raises(ConfigError, match="--draft-kv"):
        _config(live_setup, tree=TreeShape(steps=2, topk=2, num_draft_tokens=4), draft_kv="both")


@pytest.mark.gpu
def test_tree_decoding_on_cuda_is_lossless_and_grows_the_cpu_trees(tiny_llama_dir):
    """The tree mask, the cache compaction and the batched growth on a CUDA device (fp32)."""
    from transformers import AutoModelForCausalLM

    from osprey_train.drafters.osprey.model import OspreyDrafter
    from osprey_train.models import DrafterConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval().cuda()
    target = HFTargetSession(model, (2, 3, 4))
    torch.manual_seed(0)
    drafter = OspreyDrafter(DrafterConfig.from_name("tiny")).eval()
    with torch.no_grad():  # non-zero extra QKV columns: the condition matters
        for p in drafter.parameters():
            if p.dim() == 2 and float(p.abs().sum()) == 0.0:
                p.normal_(0.0, 0.02)
    drafter_gpu = OspreyDrafter(drafter.config).eval().cuda()
    drafter_gpu.load_state_dict(drafter.state_dict())
    shape = TreeShape(steps=3, topk=2, num_draft_tokens=6)
    for prompt in ([5, 17, 42, 99, 3], [250, 7, 7, 1]):
        reference = plain_generate(target, prompt, max_new_tokens=20).output_ids
        session = TreeDrafterSession(drafter_gpu)
        assert tree_speculative_generate(target, session, prompt, shape=shape, max_new_tokens=20).output_ids == reference
        scripted = ScriptedTreeDrafter(reference, len(prompt), model.config.vocab_size)
        res = tree_speculative_generate(target, scripted, prompt, shape=TreeShape(steps=3, topk=2, num_draft_tokens=7),
                                        max_new_tokens=20)
        assert res.output_ids == reference and res.accept_lengths[:4] == [4, 4, 4, 4]
    ids = torch.tensor([5, 17, 42, 99, 3, *reference])
    target.reset()
    _, taps = target.forward(ids.tolist(), want_taps=True)
    roots = torch.tensor(list(round_roots(len(ids), 5)))
    for kv in ("sglang", "ancestors"):
        cpu = grow_trees(drafter, ids, taps.cpu(), roots, topk=4, steps=3, kv=kv)
        gpu = grow_trees(drafter_gpu, ids, taps, roots, topk=4, steps=3, kv=kv)
        assert torch.equal(cpu.tokens_RC, gpu.tokens_RC) and torch.equal(cpu.parent_RC, gpu.parent_RC)
        torch.testing.assert_close(cpu.scores_RC, gpu.scores_RC, rtol=1e-4, atol=1e-6)

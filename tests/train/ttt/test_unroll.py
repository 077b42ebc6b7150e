"""The TTT unroll against an explicit per-slot incremental decode with the real drafter.

The batches here are already in the engine layout (slot ``p`` holds its token, its taps and its
target): the packer's side of the layout is tested in ``tests/train/distill_data``.
"""

from __future__ import annotations

import pytest
import torch

from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.models import DrafterConfig, KVCacheAttention
from osprey_train.ttt.attention import document_positions
from osprey_train.ttt.unroll import PackedBatch, ttt_hidden_states, ttt_loss


def _drafter(seed=0, name="tiny"):
    torch.manual_seed(seed)
    cfg = (DrafterConfig.from_name("tiny-eagle3", num_layers=2) if name == "tiny-eagle3-2l"
           else DrafterConfig.from_name(name))
    if cfg.arch == "osprey":
        model = OspreyDrafter(cfg)
    else:
        from osprey_train.drafters.eagle3.model import Eagle3Drafter

        model = Eagle3Drafter(cfg)
    model.reset_parameters()
    # Give the zero-initialized extra QKV columns some weight so conditions matter.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model.eval()


def _batch(lengths=(7, 9), V=384, K=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    ids = torch.randint(0, V, (1, T), generator=g)
    taps = torch.randn(1, T, 3, 64, generator=g)
    lp = torch.log_softmax(torch.randn(1, T, V, generator=g) * 3, -1)
    top = lp.topk(K, dim=-1)
    mask = torch.rand(1, T, generator=g) > 0.3
    return PackedBatch(input_ids_BT=ids, doc_ids_BT=doc, position_ids_BT=document_positions(doc),
                       taps_BTLDt=taps, loss_mask_BT=mask, topk_ids_BTK=top.indices.int(),
                       topk_logprobs_BTK=top.values)


def _naive_chain(model, batch, slot, steps):
    """Hiddens h^0..h^{steps-1} of the chain starting at ``slot``, by incremental decoding."""
    doc = batch.doc_ids_BT[0]
    start = int((doc == doc[slot]).nonzero()[0])
    end = int((doc == doc[slot]).nonzero()[-1]) + 1
    cond = model.fuse_taps(batch.taps_BTLDt[:, start:end])  # this document only, slot p reads c_p
    p = slot - start
    cache = KVCacheAttention(model.config.num_layers)
    prefix = model.forward_hidden(batch.input_ids_BT[:, start:slot + 1], cond[:, :p + 1],
                                  torch.arange(p + 1)[None], cache)
    hs = [prefix[:, -1]]
    for k in range(1, steps):
        if slot + k >= end:
            break
        h = model.forward_hidden(batch.input_ids_BT[:, slot + k:slot + k + 1], hs[-1][:, None],
                                 torch.tensor([[p + k]]), cache)
        hs.append(h[:, 0])
    return hs


@pytest.mark.parametrize("impl,name", [("sdpa", "tiny"), ("eager", "tiny"), ("sdpa", "tiny-eagle3-2l")])
def test_unroll_hidden_matches_incremental_decode(impl, name):
    model = _drafter(name=name)
    batch = _batch()
    steps = 4
    with torch.no_grad():
        cond0 = model.fuse_taps(batch.taps_BTLDt)
        hs = ttt_hidden_states(model, batch.input_ids_BT, cond0, batch.position_ids_BT,
                               batch.doc_ids_BT, steps, impl=impl)
        for slot in range(batch.input_ids_BT.shape[1]):
            ref = _naive_chain(model, batch, slot, steps)
            for k, h in enumerate(ref):
                torch.testing.assert_close(hs[k][:, slot], h, atol=1e-5, rtol=1e-5)


def test_loss_matches_naive_per_step_formula():
    model = _drafter()
    batch = _batch()
    steps, decay = 3, 0.7
    out = ttt_loss(model, batch, steps=steps, decay=decay, target_dist="renorm", chunk_size=5)
    T = batch.input_ids_BT.shape[1]
    ref = 0.0
    with torch.no_grad():
        chains = [_naive_chain(model, batch, slot, steps) for slot in range(T)]
        for k in range(steps):
            ces = []
            for slot in range(T):
                hs = chains[slot]
                if k >= len(hs) or not batch.loss_mask_BT[0, slot + k]:
                    continue
                logq = torch.log_softmax(model.logits(hs[k]), -1)[0]
                p = torch.softmax(batch.topk_logprobs_BTK[0, slot + k], -1)
                ces.append(-(p * logq[batch.topk_ids_BTK[0, slot + k].long()]).sum())
            ref += decay ** k * torch.stack(ces).mean()
            assert out.metrics[f"scored_k{k}"] == len(ces)
    torch.testing.assert_close(out.loss, ref, atol=1e-5, rtol=1e-5)
    assert set(out.metrics) >= {"loss_k0", "acc_k2", "tokens"}


def test_step_checkpointing_gives_same_gradients():
    batch = _batch()
    grads = []
    for ckpt in (False, True):
        model = _drafter().train()
        out = ttt_loss(model, batch, steps=3, checkpoint_steps=ckpt)
        out.loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_eagle3_unroll_runs_with_draft_vocab():
    from osprey_train.ttt.loss import VocabMap

    model = _drafter(name="tiny-eagle3").train()
    model.set_draft_vocab(torch.arange(128) * 3)
    batch = _batch()
    vmap = VocabMap.from_drafter(model.draft_to_target, 384)
    out = ttt_loss(model, batch, steps=3, vmap=vmap)
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.lm_head.weight.grad is not None


def test_batch_without_scored_slots_gives_zero_loss_and_runs_backward():
    model = _drafter().train()
    batch = _batch()
    batch.loss_mask_BT = torch.zeros_like(batch.loss_mask_BT)
    out = ttt_loss(model, batch, steps=2)
    out.loss.backward()
    assert float(out.loss) == 0.0 and out.metrics["scored_k0"] == 0.0


@pytest.mark.parametrize("target_dist", ["tail", "renorm"])
def test_eagle3_leaves_out_of_vocab_targets_unscored(target_dist):
    """Default: a slot whose target top-1 is not in the draft vocabulary is not scored (SpecForge);
    --score-out-of-vocab keeps the old behaviour of scoring it."""
    from osprey_train.ttt.loss import VocabMap

    model = _drafter(name="tiny-eagle3")
    model.set_draft_vocab(torch.arange(128) * 3)
    batch = _batch()
    vmap = VocabMap.from_drafter(model.draft_to_target, 384)
    in_vocab = batch.topk_ids_BTK[..., 0] % 3 == 0
    assert 0 < int((in_vocab & batch.loss_mask_BT).sum()) < int(batch.loss_mask_BT.sum())  # both kinds present
    steps = 3
    default = ttt_loss(model, batch, steps=steps, vmap=vmap, target_dist=target_dist)
    old = ttt_loss(model, batch, steps=steps, vmap=vmap, target_dist=target_dist, score_out_of_vocab=True)
    # the default equals scoring everything on a batch whose loss mask already drops those slots
    masked = PackedBatch(**{**batch.__dict__, "loss_mask_BT": batch.loss_mask_BT & in_vocab})
    reference = ttt_loss(model, masked, steps=steps, vmap=vmap, target_dist=target_dist, score_out_of_vocab=True)
    torch.testing.assert_close(default.loss, reference.loss)
    assert default.metrics["scored_k0"] == int((batch.loss_mask_BT & in_vocab).sum())
    assert old.metrics["scored_k0"] == int(batch.loss_mask_BT.sum())
    assert default.metrics["out_of_vocab_k0"] == old.metrics["scored_k0"] - default.metrics["scored_k0"]
    assert not torch.allclose(default.loss, old.loss)
    # a full-vocabulary Osprey drafter: nothing is left out
    osprey = ttt_loss(_drafter(), batch, steps=steps, target_dist=target_dist)
    assert osprey.metrics["scored_k0"] == old.metrics["scored_k0"] and "out_of_vocab_k0" not in osprey.metrics

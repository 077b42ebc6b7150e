"""The DFlash block drafter: training computes what drafting computes, convert/export keep the target's
pieces, offline drafts equal the live session's, and live decoding is lossless.

Tiny models only (the d = 64 Llama target with the 384-token tokenizer); vLLM's own class loads the
export in the engine tests (tests/train/engines/test_vllm_engine.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from osprey_data.errors import CheckpointError, ConfigError, ModelError
from osprey_data.store import StoreReader
from osprey_train.distill_data.packing import pack_samples
from osprey_train.drafters.dflash.drafting import DFlashSession, draft_all_positions
from osprey_train.drafters.dflash.export import SHARED_WITH_TARGET
from osprey_train.drafters.dflash.objective import DFlashObjective, eligible_anchors, row_blocks
from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.evaluation.live import run as live
from osprey_train.evaluation.options import LiveConfig
from osprey_train.export import ExportConfig, load_export
from osprey_train.export import run as export_run
from osprey_train.models import DrafterConfig, load_drafter
from osprey_train.models.io import build_drafter
from osprey_train.stages.convert import ConvertConfig
from osprey_train.stages.convert import run as convert
from osprey_train.stages.defaults import distill_optim
from osprey_train.stages.distill import DistillConfig
from osprey_train.stages.distill import run as distill
from osprey_train.trainer import LoopConfig
from tests.helpers.sweeps import write_sweep
from tests.train.models.tiny_targets import make_fake_store

V, DT, TAPS, BLOCK = 384, 64, 3, 4


def tiny(seed: int = 0, block: int = BLOCK):
    torch.manual_seed(seed)
    config = DrafterConfig.from_name("tiny", arch="dflash", family="qwen3", qk_norm=True, num_layers=2,
                                     arch_options={"block_size": block, "mask_token_id": 5})
    model = build_drafter(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def sequence(length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (length,), generator=g), torch.randn(length, TAPS, DT, generator=g)


class FakeSample:
    """What pack_samples reads of a store sample."""

    def __init__(self, ids, taps, prompt_length: int) -> None:
        self.token_ids, self.hidden_TLD = ids, taps
        self.loss_mask = torch.arange(ids.shape[0]) >= prompt_length
        self.topk_ids_TK = torch.zeros(ids.shape[0], 2, dtype=torch.int32)
        self.topk_logprobs_TK = torch.zeros(ids.shape[0], 2)
        self.final_hidden_TD, self.sample_id = None, "s"


def test_training_blocks_equal_drafting_blocks_and_the_live_session():
    """A block in a packed training row (two documents, many anchors at once) gives the logits that
    drafting the same round gives, offline (all anchors of one sequence) and live (cached context)."""
    model = tiny()
    (ids_a, taps_a), (ids_b, taps_b) = sequence(9, 1), sequence(13, 2)
    batch = pack_samples([FakeSample(ids_a, taps_a, 3), FakeSample(ids_b, taps_b, 4)], 64)
    ids_P, doc_P, pos_P = batch.input_ids_BT[0], batch.doc_ids_BT[0], batch.position_ids_BT[0]
    first_b = int((doc_P == 0).sum())
    anchors = torch.tensor([2, first_b + 3, first_b + 6, first_b + 9])   # slots; two overlapping blocks in doc b
    blocks = row_blocks(anchors, ids_P, doc_P, batch.loss_mask_BT[0].bool(), BLOCK)
    with torch.no_grad():
        context = model.context(batch.taps_BTLDt[0], pos_P)
        hidden = model.block_hidden(ids_P[anchors], pos_P[anchors] + 1, BLOCK, context, blocks.allowed_NP)
        train_logits = model.logits(hidden[:, 1:])
    for n, slot in enumerate(anchors.tolist()):
        ids, taps, a = (ids_a, taps_a, slot + 1) if slot < first_b else (ids_b, taps_b, slot - first_b + 1)
        # the round after x_0..x_a: the block anchored at position a of the document alone
        offline = model.block_logits(ids, taps, torch.tensor([a]), BLOCK)[0]
        torch.testing.assert_close(train_logits[n], offline, atol=1e-5, rtol=1e-5)
        # the labels are the tokens the block drafts, never past its document
        want = ids[a + 1: a + BLOCK]
        assert blocks.labels_NJ[n][blocks.scored_NJ[n]].tolist() == want[:int(blocks.scored_NJ[n].sum())].tolist()
        session = DFlashSession(model)
        chunks = [taps[:2], taps[2:a]] if a > 2 else [taps[:a]]
        session.propose(ids[:3].tolist(), chunks[0], 0, 0.0, None) if a > 2 else None
        drafts, probs = session.propose(ids[:a + 1].tolist(), chunks[-1], BLOCK - 1, 1.0, torch.Generator())
        torch.testing.assert_close(probs, torch.softmax(offline, -1), atol=1e-5, rtol=1e-5)


def test_offline_drafts_are_the_live_rounds_and_more_steps_than_the_block_are_refused():
    model = tiny(3)
    ids, taps = sequence(12, 4)
    drafts = draft_all_positions(model, ids, taps, BLOCK - 1)
    assert drafts.shape == (11, BLOCK - 1)
    session = DFlashSession(model)
    done = 0
    for a in (1, 2, 5, 6, 11):   # rounds that commit uneven numbers of positions
        got, _ = session.propose(ids[:a + 1].tolist(), taps[done:a], BLOCK - 1, 0.0, None)
        assert got == drafts[a - 1].tolist()
        done = a
    two = draft_all_positions(model, ids, taps, 2)   # S drafts: a block of 1 + S slots, as vLLM drafts
    assert two.shape == (11, 2)
    with pytest.raises(ConfigError, match="at most 3 drafts"):
        draft_all_positions(model, ids, taps, BLOCK)
    with pytest.raises(ModelError, match="expected"):
        DFlashSession(model).propose(ids[:4].tolist(), taps[:1], 2, 0.0, None)


def test_anchors_are_response_tokens_and_training_learns_a_fixed_batch():
    ids, taps = sequence(30, 5)
    batch = pack_samples([FakeSample(ids, taps, 10)], 64)
    mask = batch.loss_mask_BT[0].bool()
    eligible = eligible_anchors(batch.doc_ids_BT[0], mask)
    # slot p anchors x_{p+1}: both it (mask of slot p - 1) and the first label (slot p) are response tokens
    assert eligible.min() == 9 and bool(mask[eligible].all() and mask[eligible - 1].all())
    model = tiny(6).train()
    objective = DFlashObjective(model, decay=0.8, chunk_size=7)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    torch.manual_seed(0)
    first = None
    for _ in range(40):
        loss, metrics = objective(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first = first if first is not None else float(loss.detach())
        assert metrics["anchors"] >= 1 and "acc_k1" in metrics
        assert metrics["tokens"] == batch.input_ids_BT.numel()   # the progress bar's tok/s (was 0)
    assert float(loss) < 0.5 * first
    assert model.embed_tokens.weight.grad is None and model.lm_head.weight.grad is None   # the target's: frozen


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_llama_dir):
    return make_fake_store(tmp_path_factory.mktemp("dflash") / "store", tiny_llama_dir, taps=(2, 3, 4), length=24)


def test_convert_copies_the_targets_pieces_and_takes_arch_options(store, tiny_llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    out = convert(ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "d",
                                eagle3_layers=2, arch_option=("block_size=6",))).out
    model = load_drafter(out)
    assert model.config.arch_options["block_size"] == 6 and model.config.num_layers == 2
    assert torch.equal(model.embed_tokens.weight, target.get_input_embeddings().weight)
    assert torch.equal(model.lm_head.weight, target.get_output_embeddings().weight)
    # the mask token is one no stored response token uses (the fake store's responses end in token 7)
    reader = StoreReader(str(store))
    used = {int(t) for i in range(len(reader)) for t, m in zip(reader.sample(i).token_ids, reader.sample(i).loss_mask)
            if m}
    assert model.mask_token_id not in used
    for bad, why in ((("block_size",), "not KEY=VALUE"), (("blocks=4",), "not an option of the 'dflash' arch"),
                     (("block_size=x",), "not JSON")):
        with pytest.raises(ConfigError, match=why):
            ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "x",
                          arch_option=bad)
    with pytest.raises(ConfigError, match="block_size must be an integer"):
        convert(ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "y",
                              arch_option=("block_size=1",)))
    with pytest.raises(ConfigError, match="it takes none"):
        ConvertConfig(arch="eagle3", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "z",
                      arch_option=("block_size=4",))
    with pytest.raises(ConfigError, match="--draft-vocab does not apply"):
        ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "w",
                      draft_vocab_size=64)


@pytest.fixture(scope="module")
def trained(store, tiny_llama_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("dflash-run")
    init = convert(ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), out=work / "init",
                                 arch_option=("block_size=4",))).out
    loop = LoopConfig(out_dir=work / "run", max_steps=3, device="cpu", progress=False, log_every=1, save_every=2)
    result = distill(DistillConfig(drafter=init, store=str(store), loop=loop, optim=distill_optim(lr=1e-3),
                                   tokens_per_batch=64))
    return init, result.final_dir


def test_distill_trains_it_and_acceptance_walks_its_blocks(trained, store):
    init, final = trained
    before, after = load_drafter(init), load_drafter(final)
    assert not torch.equal(before.fc.weight, after.fc.weight)
    assert torch.equal(before.lm_head.weight, after.lm_head.weight)   # frozen through distillation
    report = evaluate_acceptance(after, StoreReader(str(store)), steps=3, progress=False)
    assert 1.0 <= report.overall <= 4.0 and len(report.per_position) == 3
    with pytest.raises(ConfigError, match="'dflash' drafter does not draft"):
        evaluate_acceptance(after, StoreReader(str(store)), steps=3, progress=False, temperature=0.7)


def test_vllm_export_leaves_the_targets_pieces_out_and_reads_back(trained, tmp_path):
    _, final = trained
    model = load_drafter(final)
    out = export_run(ExportConfig(drafter=final, format="vllm", out=tmp_path / "vllm", dtype="float32")).out
    doc = json.loads((out / "config.json").read_text())
    assert doc["architectures"] == ["DFlashDraftModel"] and doc["model_type"] == "qwen3"
    assert doc["dflash_config"] == {"mask_token_id": model.mask_token_id, "target_layer_ids": [1, 2, 3]}
    assert doc["block_size"] == 4 and doc["target_hidden_size"] == DT
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert not names & set(SHARED_WITH_TARGET) and "fc.weight" in names and "layers.0.self_attn.q_norm.weight" in names
    back = load_export(out, "vllm")
    ids, taps = sequence(10, 7)
    torch.testing.assert_close(back.block_logits(ids, taps, torch.arange(1, 10), 4),
                               model.block_logits(ids, taps, torch.arange(1, 10), 4))
    doc["osprey_target"]["name_or_path"] = str(tmp_path / "gone")
    (out / "config.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="needs the target's safetensors folder"):
        load_export(out, "vllm")


def test_sglang_export_is_the_engine_layout_with_dflash_serving_flags(trained, tmp_path):
    """SGLang's DFlashDraftModel reads the layout vLLM reads; serving.json says DFLASH and the block size."""
    _, final = trained
    model = load_drafter(final)
    out = export_run(ExportConfig(drafter=final, format="sglang", out=tmp_path / "sg", dtype="float32")).out
    vllm = export_run(ExportConfig(drafter=final, format="vllm", out=tmp_path / "vllm", dtype="float32")).out
    doc, served = (json.loads((out / name).read_text()) for name in ("config.json", "serving.json"))
    assert doc == json.loads((vllm / "config.json").read_text())
    assert (out / "model.safetensors").read_bytes() == (vllm / "model.safetensors").read_bytes()
    assert served["speculative_algorithm"] == "DFLASH" and served["speculative_num_draft_tokens"] == BLOCK
    assert "--speculative-num-draft-tokens 4" in served["launch"] and "--speculative-eagle-topk" not in served["launch"]
    assert "Block: `--speculative-num-draft-tokens 4`" in (out / "README.md").read_text()
    back = load_export(out, "sglang")
    ids, taps = sequence(10, 7)
    torch.testing.assert_close(back.block_logits(ids, taps, torch.arange(1, 10), 4),
                               model.block_logits(ids, taps, torch.arange(1, 10), 4))
    sweep, _ = write_sweep(tmp_path / "sweep.json")
    with pytest.raises(ConfigError, match="a sweep's shapes are chains and trees"):
        export_run(ExportConfig(drafter=final, format="sglang", out=tmp_path / "sg2", sweep=sweep))


def test_live_decoding_with_it_is_lossless(trained, tiny_llama_dir, tmp_path):
    _, final = trained
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": f"p{i}", "domain": "chat", "conversations": [{"role": "user", "content": text}]}
            for i, text in enumerate(["Say something.", "Count to ten, slowly, please."])]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = live(LiveConfig(drafter=str(final), target=str(tiny_llama_dir), inputs=str(prompts), steps=3,
                             max_new_tokens=12, device="cpu", allow_target_mismatch=True, precision="float32"))
    assert report.num_prompts == 2
    assert all(s["identical"] for s in report.samples), report.samples
    # --steps auto chooses S up to the block's 3 mask slots, not --max-steps' 5; a fixed S above them is refused
    auto = live(LiveConfig(drafter=str(final), target=str(tiny_llama_dir), inputs=str(prompts), max_steps=5,
                           max_new_tokens=12, device="cpu", allow_target_mismatch=True, precision="float32",
                           cost="draft_step=0.01,verify_scale=0.01,round_overhead=0"))
    assert all(s["identical"] for s in auto.samples), auto.samples
    with pytest.raises(ConfigError, match="exceeds what the 'dflash' drafter drafts per round"):
        live(LiveConfig(drafter=str(final), target=str(tiny_llama_dir), inputs=str(prompts), steps=5,
                        max_new_tokens=12, device="cpu", allow_target_mismatch=True, precision="float32"))


def test_blocks_in_checkpointed_groups_give_the_loss_and_gradients_of_one_group():
    ids, taps = sequence(40, 8)
    batch = pack_samples([FakeSample(ids, taps, 8)], 64)

    def run(blocks_per_group: int):
        model = tiny(9).train()
        objective = DFlashObjective(model, decay=0.8, chunk_size=5)
        objective.blocks_per_group = blocks_per_group
        torch.manual_seed(1)   # the same anchors
        loss, _ = objective(batch)
        loss.backward()
        return loss.detach(), model.fc.weight.grad.clone(), model.layers[0].self_attn.k_proj.weight.grad.clone()

    whole, grouped = run(1000), run(3)
    for a, b in zip(whole, grouped):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def _topk_model(objective: str):
    model = tiny(9)
    model.config.arch_options["objective"] = objective
    return model.train()


def test_the_topk_objective_learns_the_stored_distribution_of_each_label():
    """Issue 44: ``objective=topk`` scores mask slot j against the top-k stored with its label (the row of
    the slot before it). A one-hot top-k at the stored token gives exactly the hard-label loss and
    gradients; moving the rows by one slot (a wrong alignment) does not."""
    ids, taps = sequence(30, 7)
    sample = FakeSample(ids, taps, 8)
    other = (ids + 1) % V
    sample.topk_ids_TK = torch.stack([torch.roll(ids, -1), torch.roll(other, -1)], dim=1).int()   # row t: token t+1
    sample.topk_logprobs_TK = torch.tensor([[0.0, -40.0]]).expand(30, 2).clone()
    batch = pack_samples([sample], 64)
    losses = {}
    for objective, dist in (("hard", "tail"), ("topk", "tail"), ("topk", "renorm")):
        model = _topk_model(objective)
        torch.manual_seed(1)
        loss, metrics = DFlashObjective(model, decay=0.8, chunk_size=5, target_dist=dist)(batch)
        loss.backward()
        losses[objective, dist] = (float(loss.detach()), model.layers[0].self_attn.q_proj.weight.grad.clone(), metrics["acc_k1"])
    hard = losses["hard", "tail"]
    for key in (("topk", "tail"), ("topk", "renorm")):
        assert losses[key][0] == pytest.approx(hard[0], rel=1e-5) and losses[key][2] == hard[2]
        torch.testing.assert_close(losses[key][1], hard[1], atol=1e-6, rtol=1e-4)
    shifted = FakeSample(ids, taps, 8)
    shifted.topk_ids_TK = torch.roll(sample.topk_ids_TK, 1, dims=0)
    shifted.topk_logprobs_TK = sample.topk_logprobs_TK
    torch.manual_seed(1)
    loss, _ = DFlashObjective(_topk_model("topk"), decay=0.8, chunk_size=5, target_dist="tail")(pack_samples([shifted], 64))
    assert abs(float(loss) - hard[0]) > 0.1


def test_the_topk_objective_is_checked():
    with pytest.raises(ConfigError, match="tail or renorm"):
        DFlashObjective(_topk_model("topk"), decay=0.8, chunk_size=5, target_dist="full")
    model = tiny()
    model.config.arch_options["objective"] = "soft"
    from osprey_train.drafters.dflash.arch import SPEC
    with pytest.raises(ConfigError, match="objective must be one of"):
        SPEC.check_config(model.config)

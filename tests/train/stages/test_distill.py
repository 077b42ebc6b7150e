"""Stage 4 (distill): packing, the stage on the real trainer, eagle3/full variants, errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from osprey_data.errors import ConfigError, ModelError
from osprey_data.store import StoreReader
from osprey_train.distill_data.packing import StorePacker, plan_epoch
from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.models import load_drafter
from osprey_train.stages.defaults import distill_optim
from osprey_train.stages.distill import DistillConfig, run
from osprey_train.trainer import LoopConfig, OptimConfig
from tests.train.evaluation.store_util import make_drafter_dir, make_sharp_llama, make_store



@pytest.fixture(scope="module")
def builder_store(tmp_path_factory, tiny_llama_dir):
    """A store written by the real builder (final hidden included) from the tiny Llama."""
    root = tmp_path_factory.mktemp("distill_builder")
    return make_store(root / "store", tiny_llama_dir, num_samples=6, max_new_tokens=10,
                      final_hidden=True)


@pytest.fixture(scope="module")
def greedy_setup(tmp_path_factory, tiny_tokenizer_dir):
    """A peaked tiny target and a store of its exact greedy responses (see store_util)."""
    root = tmp_path_factory.mktemp("distill_greedy")
    target = make_sharp_llama(root / "target", tiny_tokenizer_dir, init_range=0.6)
    return make_store(root / "store", target, num_samples=6, max_new_tokens=12)


_LOOP_FIELDS = {f.name for f in dataclasses.fields(LoopConfig)}
_OPTIM_FIELDS = {f.name for f in dataclasses.fields(OptimConfig)}


def _cfg(tmp_path, drafter, store, **kw):
    """A DistillConfig; loop and optimizer fields may be given flat, as keywords of their own."""
    base = dict(out_dir=tmp_path / "run", max_steps=3, tokens_per_batch=96, ttt_steps=3, device="cpu",
                progress=False, log_every=1, lr=1e-3)
    base.update(kw)
    loop = LoopConfig(**{k: base.pop(k) for k in list(base) if k in _LOOP_FIELDS})
    optim = distill_optim(**{k: base.pop(k) for k in list(base) if k in _OPTIM_FIELDS})
    return DistillConfig(drafter=drafter, store=str(store), loop=loop, optim=optim, **base)


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_packing_is_document_masked_and_deterministic(builder_store):
    reader = StoreReader(str(builder_store))
    packer = StorePacker(reader, 96, seed=1)
    b0 = packer.batch(0)
    assert b0.num_tokens <= 96
    doc, pos = b0.doc_ids_BT[0], b0.position_ids_BT[0]
    assert int(pos[0]) == 0 and bool(((pos[1:] == 0) == (doc[1:] != doc[:-1])).all())
    # engine layout, per sample of n tokens: n - 1 slots; slot p = (x_{p+1}, c_p) at position p, scored
    # by the store mask of x_{p+2} and against the target's distribution stored at p + 1
    plan = packer.plan(0)
    offset = 0
    for i in plan.rows[0]:
        s = reader.sample(i, as_torch=True)
        n = s.token_ids.shape[0]
        row = slice(offset, offset + n - 1)
        assert b0.input_ids_BT[0, row].tolist() == s.token_ids[1:].tolist()
        assert pos[row].tolist() == list(range(n - 1))
        torch.testing.assert_close(b0.taps_BTLDt[0, row], s.hidden_TLD[:-1])
        torch.testing.assert_close(b0.topk_logprobs_BTK[0, row], s.topk_logprobs_TK[1:].float())
        assert b0.loss_mask_BT[0, offset: offset + n - 2].tolist() == s.loss_mask[2:].bool().tolist()
        assert not bool(b0.loss_mask_BT[0, offset + n - 2])  # x_{n} does not exist
        # the first response token x_r is scored (predicted by slot r - 2, from x_{r-1})
        assert bool(b0.loss_mask_BT[0, offset + s.prompt_length - 2])
        offset += n - 1
    assert offset == b0.num_tokens
    torch.testing.assert_close(packer.batch(0).taps_BTLDt, b0.taps_BTLDt)
    # every sample exactly once per epoch
    lengths = reader.table(["num_tokens"]).column(0).to_numpy()
    rows = plan_epoch(np.asarray(lengths), 96, 1, 3).rows
    assert sorted(i for r in rows for i in r) == list(range(len(reader)))


def test_distill_runs_on_builder_store_with_metrics_and_resume(tmp_path, builder_store):
    import shutil

    drafter = make_drafter_dir(tmp_path / "drafter", store=builder_store)
    cfg = dict(max_steps=3, save_every=1, eval_store=str(builder_store), eval_samples=2)
    res = run(_cfg(tmp_path, drafter, builder_store, **cfg))
    recs = _records(tmp_path / "run")
    train = [r for r in recs if r["kind"] == "train"]
    assert len(train) == 3 and {"loss_k0", "acc_k2", "scored_k1"} <= set(train[-1])
    assert any("accept_len" in r for r in recs if r["kind"] == "eval")
    assert (res.final_dir / "model.safetensors").is_file()
    load_drafter(res.final_dir)
    # Lose the last checkpoint, resume from step 2: step 3 is replayed exactly.
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-3")
    res2 = run(_cfg(tmp_path, drafter, builder_store, resume=True, **cfg))
    assert res2.resumed_from.name == "step-2" and res2.step == 3
    again = [r for r in _records(tmp_path / "run") if r["kind"] == "train" and r["step"] == 3][-1]
    assert again["loss"] == pytest.approx(train[-1]["loss"], rel=1e-6)


def test_prefetch_changes_nothing_but_speed(tmp_path, builder_store):
    """Batches prepared on the prefetch thread train exactly like batches built on demand
    (the resume test above runs with the default prefetch, so resume stays exact with it)."""
    from safetensors.torch import load_file

    drafter = make_drafter_dir(tmp_path / "drafter", store=builder_store)
    runs = {n: run(_cfg(tmp_path / f"p{n}", drafter, builder_store, max_steps=4, tokens_per_batch=64, prefetch=n))
            for n in (0, 3)}
    losses = {n: [r["loss"] for r in _records(tmp_path / f"p{n}" / "run") if r["kind"] == "train"] for n in runs}
    assert len(losses[0]) == 4 and losses[0] == losses[3]
    w0, w3 = (load_file(str(runs[n].final_dir / "model.safetensors")) for n in (0, 3))
    assert all(torch.equal(w0[k], w3[k]) for k in w0)
    with pytest.raises(ConfigError, match="--prefetch"):
        _cfg(tmp_path, drafter, builder_store, prefetch=-1)


def test_distilled_drafter_beats_its_initialization(tmp_path, greedy_setup):
    drafter = make_drafter_dir(tmp_path / "drafter", seed=5)
    reader = StoreReader(str(greedy_setup))
    before = evaluate_acceptance(load_drafter(drafter), reader, steps=3, progress=False)
    res = run(_cfg(tmp_path, drafter, greedy_setup, max_steps=20, lr=1e-2, warmup_ratio=0.0,
                   freeze_embeddings=False, tokens_per_batch=512, log_every=5))
    after = evaluate_acceptance(load_drafter(res.final_dir), reader, steps=3, progress=False)
    assert after.overall > before.overall + 0.5, (before.overall, after.overall)
    train = [r for r in _records(tmp_path / "run") if r["kind"] == "train"]
    assert train[-1]["acc_k0"] > train[0]["acc_k0"]


@pytest.mark.parametrize("preset", ["tiny-eagle3", "tiny"])  # tiny: Osprey with convert --draft-vocab
def test_draft_vocab_drafters_and_full_vocab_targets(tmp_path, builder_store, tiny_llama_dir, preset):
    d2t = torch.arange(128) * 3
    e3 = make_drafter_dir(tmp_path / "e3", preset=preset, draft_vocab=d2t, store=builder_store)
    res = run(_cfg(tmp_path, e3, builder_store, max_steps=1, target_dist="full", target_model=str(tiny_llama_dir),
                   gradient_checkpointing=True, attention="eager"))
    rec = [r for r in _records(tmp_path / "run") if r["kind"] == "train"][-1]
    assert np.isfinite(rec["loss"]) and "acc_k0" in rec
    assert "out_of_vocab_k0" in rec  # unreachable targets left out by default
    saved = load_drafter(res.final_dir)
    assert torch.equal(saved.draft_to_target, d2t)
    from osprey_train.stages.distill import DistillTask

    task = DistillTask(_cfg(tmp_path, e3, builder_store, score_out_of_vocab=True))
    assert task.build_model().score_out_of_vocab


def test_config_and_compatibility_errors(tmp_path, builder_store, greedy_setup):
    drafter = make_drafter_dir(tmp_path / "drafter", store=greedy_setup)
    with pytest.raises(ConfigError, match="--ttt-steps"):
        _cfg(tmp_path, drafter, builder_store, ttt_steps=0)
    with pytest.raises(ConfigError, match="not a drafter folder"):   # paths are checked when the stage runs
        run(_cfg(tmp_path, tmp_path, builder_store))
    with pytest.raises(ConfigError, match="final_hidden"):
        run(_cfg(tmp_path, drafter, greedy_setup, target_dist="full"))
    from osprey_data.target_model import TapLayers
    from osprey_train.models import DrafterConfig, save_drafter
    from osprey_train.models.io import build_drafter

    other = build_drafter(DrafterConfig.from_name("tiny", tap_layers=TapLayers(layer_ids=(1, 2, 4))))
    save_drafter(other, tmp_path / "other")
    with pytest.raises(ModelError, match="tap layers"):
        run(_cfg(tmp_path, tmp_path / "other", builder_store))


def test_cli_distill(tmp_path, greedy_setup):
    from click.testing import CliRunner

    from osprey_cli.main import cli

    drafter = make_drafter_dir(tmp_path / "drafter", store=greedy_setup)
    res = CliRunner().invoke(cli, ["train", "distill", "--drafter", str(drafter), "--store", str(greedy_setup),
                                   "--out", str(tmp_path / "run"), "--steps", "1", "--ttt-steps", "2",
                                   "--tokens-per-batch", "64", "--device", "cpu", "--no-progress",
                                   "--attention", "sdpa"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "distilled 1 steps" in res.output and (tmp_path / "run" / "final" / "config.json").is_file()
    res = CliRunner().invoke(cli, ["train", "distill", "--drafter", str(drafter), "--store", str(greedy_setup),
                                   "--out", str(tmp_path / "run2"), "--ttt-decay", "0"])
    assert res.exit_code == 2 and "--ttt-decay" in res.output


def test_teacher_topk_keeps_the_most_likely_of_the_stored_top_k(tmp_path, builder_store, greedy_setup):
    """--teacher-topk N (issue 33): only the N most likely stored tokens teach, chosen by log-prob
    whatever the stored column order; the tail bucket then holds the rest of the mass."""
    from osprey_train.distill_data.packing import keep_topk

    ids = torch.tensor([[7, 3, 9, 1]])
    lps = torch.tensor([[-2.0, -0.5, -3.0, -1.0]])          # not sorted: the store's order is not relied on
    kept_ids, kept_lps = keep_topk(ids, lps, 2)
    assert kept_ids.tolist() == [[3, 1]] and kept_lps.tolist() == [[-0.5, -1.0]]
    assert keep_topk(ids, lps, 0)[0] is ids and keep_topk(ids, lps, 4)[0] is ids
    reader = StoreReader(str(builder_store))
    full_k = StorePacker(reader, 96, seed=1).batch(0)
    two = StorePacker(reader, 96, seed=1, teacher_topk=2).batch(0)
    assert two.topk_ids_BTK.shape[-1] == 2 and torch.equal(two.topk_ids_BTK, full_k.topk_ids_BTK[..., :2])
    # a distillation on it runs and learns from two tokens a position
    drafter = make_drafter_dir(tmp_path / "drafter", store=builder_store)
    res = run(_cfg(tmp_path, drafter, builder_store, max_steps=1, teacher_topk=2))
    assert np.isfinite([r for r in _records(tmp_path / "run") if r["kind"] == "train"][-1]["loss"])
    assert res.final_dir is not None
    with pytest.raises(ConfigError, match="--teacher-topk 999 exceeds the top-"):
        run(_cfg(tmp_path / "x", drafter, builder_store, teacher_topk=999))
    with pytest.raises(ConfigError, match="not to full"):
        _cfg(tmp_path, drafter, builder_store, teacher_topk=2, target_dist="full")

"""Stage 3 convert: function preservation across tokenizers, gradient flow, store/target identity, CLI."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from osprey_data.errors import ConfigError, ManifestMismatchError
from osprey_data.target_model import TapLayers
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.models import load_drafter
from osprey_train.stages.convert import ConvertConfig, run
from tests.helpers.tiny import make_tiny_llama
from tests.train.models.tiny_targets import make_fake_store, make_target

TEXT = "the cat sat on the mat. Two plus two is four. Hello there, how is the weather today?"


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_tokenizer):
    """A 2-layer backbone (tiny tokenizer, d=64) and a target with another tokenizer (d=48)."""
    root = tmp_path_factory.mktemp("convert_pair")
    backbone = make_tiny_llama(root / "backbone", tiny_tokenizer, num_layers=2, seed=5)
    target = make_target(root)
    return backbone, target, root


@pytest.fixture(scope="module")
def converted(pair):
    backbone, target, root = pair
    result = run(ConvertConfig(backbone=backbone, target=str(target), out=root / "drafter"))
    return result


def _exact_sequence(stats_alignment, target_tok, text):
    ids = target_tok(text, add_special_tokens=False)["input_ids"]
    return [t for t in ids if t in stats_alignment.exact]


def test_function_preservation_on_exactly_mapped_tokens(pair, converted):
    """At conversion, the drafter in the engine layout computes what the backbone computed.

    A sample x_0..x_n goes through the trainer's own packing (slot p = (x_{p+1}, c_p) at position p)
    and the TTT unroll's step 0, with arbitrary target taps: slot p must give the backbone's logits
    for the token sequence x_1..x_{p+1} at positions 0..p, whatever the taps are.
    """
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from osprey_train.distill_data.packing import pack_samples
    from osprey_train.stages.vocab_align import align_vocab
    from osprey_train.ttt.unroll import ttt_hidden_states

    backbone_dir, target_dir, _ = pair
    backbone = AutoModelForCausalLM.from_pretrained(backbone_dir).eval()
    src_tok, tgt_tok = AutoTokenizer.from_pretrained(backbone_dir), AutoTokenizer.from_pretrained(target_dir)
    alignment = align_vocab(src_tok, tgt_tok)
    drafter = load_drafter(converted.out)
    assert isinstance(drafter, OspreyDrafter)
    tgt_ids = _exact_sequence(alignment, tgt_tok, TEXT)
    assert len(tgt_ids) >= 15  # the texts share most words, so most tokens map exactly
    src_ids = [alignment.exact[t] for t in tgt_ids]
    columns_t = torch.tensor(sorted(alignment.exact))
    columns_s = torch.tensor([alignment.exact[int(t)] for t in columns_t])
    cfg = drafter.config
    length = len(tgt_ids)
    with torch.no_grad():
        expected = backbone(input_ids=torch.tensor([src_ids[1:]])).logits[..., columns_s]
    for seed in (0, 1):  # arbitrary target features
        g = torch.Generator().manual_seed(seed)
        sample = SimpleNamespace(
            sample_id="s", token_ids=torch.tensor(tgt_ids), loss_mask=torch.ones(length, dtype=torch.bool),
            hidden_TLD=torch.randn(length, cfg.num_taps, cfg.target_hidden_size, generator=g) * 5,
            topk_ids_TK=torch.zeros(length, 1, dtype=torch.long), topk_logprobs_TK=torch.zeros(length, 1),
            final_hidden_TD=None)
        batch = pack_samples([sample], 4096)
        assert batch.input_ids_BT[0].tolist() == tgt_ids[1:]
        with torch.no_grad():
            hidden = ttt_hidden_states(drafter, batch.input_ids_BT, drafter.fuse_taps(batch.taps_BTLDt),
                                       batch.position_ids_BT, batch.doc_ids_BT, 1)[0]
            got = drafter.logits(hidden)[..., columns_t]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # the taps do reach the layers once the extra columns are non-zero: the check above can fail
    with torch.no_grad():
        for block in drafter.extra_column_blocks():
            block.normal_(0.0, 0.5)
        moved = drafter.logits(ttt_hidden_states(drafter, batch.input_ids_BT, drafter.fuse_taps(batch.taps_BTLDt),
                                                 batch.position_ids_BT, batch.doc_ids_BT, 1)[0])[..., columns_t]
    assert (moved - expected).abs().max() > 1e-2


def test_converted_rows_and_config(pair, converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from osprey_train.stages.vocab_align import align_vocab

    backbone_dir, target_dir, _ = pair
    drafter = load_drafter(converted.out)
    cfg = drafter.config
    assert cfg.vocab_size == 320 and cfg.target_hidden_size == 48 and cfg.hidden_size == 64
    assert cfg.tap_layers == TapLayers(layer_ids=(1, 3, 5))  # default taps, L=6
    assert cfg.target.name_or_path == str(target_dir)
    assert all(float(b.detach().abs().max()) == 0.0 for b in drafter.extra_column_blocks())
    assert float(drafter.w_c.weight.detach().abs().max()) > 0
    stats = json.loads((converted.out / "alignment_stats.json").read_text())
    assert stats["exact"] + stats["averaged"] + stats["unmapped"] == 320
    assert stats["exact"] > 100 and stats["averaged"] > 0
    assert (converted.out / "tokenizer.json").exists()
    # averaged rows are the mean of the source tokenization's rows
    backbone = AutoModelForCausalLM.from_pretrained(backbone_dir)
    alignment = align_vocab(AutoTokenizer.from_pretrained(backbone_dir), AutoTokenizer.from_pretrained(target_dir))
    t, sources = next(iter(alignment.averaged.items()))
    torch.testing.assert_close(drafter.model.embed_tokens.weight[t],
                               backbone.model.embed_tokens.weight[sources].mean(0))


def _loss(drafter, seed=0):
    cfg = drafter.config
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (2, 8), generator=g)
    taps = torch.randn(2, 8, cfg.num_taps, cfg.target_hidden_size, generator=g)
    logits = drafter(ids, drafter.fuse_taps(taps), torch.arange(8)[None].expand(2, 8))
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), ids[:, 1:].reshape(-1))


def test_gradients_reach_new_columns_at_step0_and_w_c_after(converted):
    drafter = load_drafter(converted.out).train()
    _loss(drafter).backward()
    q = drafter.model.layers[0].self_attn.q_proj.weight
    d = drafter.config.hidden_size
    for layer in drafter.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            assert float(proj.weight.grad[:, d:].abs().max()) > 0, "extra columns get no gradient at step 0"
    # W_c's gradient flows only through the (still zero) columns: exactly zero at step 0 ...
    assert float(drafter.w_c.weight.grad.abs().max()) == 0.0
    assert q.grad is not None
    opt = torch.optim.SGD(drafter.parameters(), lr=0.1)
    opt.step()
    opt.zero_grad()
    _loss(drafter, seed=1).backward()
    # ... and non-zero from step 1 on.
    assert float(drafter.w_c.weight.grad.abs().max()) > 0


def test_zero_w_c_is_a_stationary_point(converted):
    drafter = load_drafter(converted.out).train()
    with torch.no_grad():
        drafter.w_c.weight.zero_()
    _loss(drafter).backward()
    d = drafter.config.hidden_size
    col_grads = [p.weight.grad[:, d:] for layer in drafter.model.layers
                 for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)]
    assert all(float(g.abs().max()) == 0.0 for g in col_grads)
    assert float(drafter.w_c.weight.grad.abs().max()) == 0.0


def test_convert_from_store_takes_identity_and_taps(pair, tmp_path, tiny_tokenizer_dir):
    backbone, target, root = pair
    store = make_fake_store(tmp_path / "store", target, taps=(1, 3, 4))
    # --target is only the tokenizer folder here (the store holds the identity)
    result = run(ConvertConfig(backbone=backbone, store=str(store), target=str(root / "tok"), out=tmp_path / "d"))
    cfg = load_drafter(result.out).config
    assert cfg.tap_layers.layer_ids == (1, 3, 4) and cfg.num_taps == 3
    from osprey_data.store import StoreReader

    assert cfg.target == StoreReader(str(store)).header.target
    # the wrong tokenizer for this store is refused
    with pytest.raises(ManifestMismatchError, match="tokenizer"):
        run(ConvertConfig(backbone=backbone, store=str(store), target=str(tiny_tokenizer_dir), out=tmp_path / "e"))
    assert not (tmp_path / "e").exists()


def test_convert_config_checks(tmp_path):
    with pytest.raises(ConfigError, match="--backbone"):
        ConvertConfig(out=tmp_path / "o", target="t")
    with pytest.raises(ConfigError, match="--target MODEL or --store"):
        ConvertConfig(out=tmp_path / "o", backbone=tmp_path)
    with pytest.raises(ConfigError, match="eagle3"):
        ConvertConfig(out=tmp_path / "o", arch="eagle3", target="t")
    with pytest.raises(ConfigError, match="conflicts"):
        ConvertConfig(out=tmp_path / "o", backbone=tmp_path, store="s", taps=(1, 2, 3))


def test_cli_convert(pair, tmp_path):
    from osprey_cli.main import cli

    backbone, target, _ = pair
    runner = CliRunner()
    res = runner.invoke(cli, ["train", "convert", "--backbone", str(backbone), "--target", str(target),
                              "--taps", "1,2,5", "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert "exact=" in res.output
    assert load_drafter(tmp_path / "d").config.tap_layers.layer_ids == (1, 2, 5)
    res = runner.invoke(cli, ["train", "convert", "--backbone", str(tmp_path / "nope"), "--target", str(target),
                              "--out", str(tmp_path / "e")])
    assert res.exit_code == 2 and "config.json" in res.output
    # taps are checked where they enter: order, duplicates, and the target's 6 layers (1..5)
    for taps, message in (("3,1,5", "strictly increasing"), ("1,1,5", "strictly increasing"),
                          ("1,2,6", "outside 1..5")):
        res = runner.invoke(cli, ["train", "convert", "--backbone", str(backbone), "--target", str(target),
                                  "--taps", taps, "--out", str(tmp_path / "f")])
        assert res.exit_code == 2 and message in res.output, res.output
        assert not (tmp_path / "f").exists()


def test_draft_vocab_keeps_the_most_frequent_tokens_with_their_logits(pair, tmp_path):
    """``--draft-vocab N``: the LM head keeps the rows of the store's N most frequent loss-masked
    target tokens (d2t stored), and on those tokens the converted drafter computes exactly the
    backbone's logits, carried through the vocabulary alignment (a copied row gives the source
    token's logit, an averaged row the mean of its pieces' logits)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from osprey_train.stages.draft_vocab import loss_masked_token_counts, select_draft_vocab
    from osprey_train.stages.vocab_align import align_vocab

    backbone_dir, target_dir, root = pair
    store = make_fake_store(tmp_path / "store", target_dir, taps=(1, 3, 5))
    result = run(ConvertConfig(backbone=backbone_dir, store=str(store), target=str(root / "tok"),
                               out=tmp_path / "dv", draft_vocab_size=40))
    drafter = load_drafter(result.out)
    cfg = drafter.config
    assert cfg.draft_vocab_size == 40 and cfg.vocab_size == 320 and drafter.lm_head.weight.shape[0] == 40
    d2t = drafter.draft_to_target
    assert d2t.tolist() == select_draft_vocab(loss_masked_token_counts(str(store), 320), 40).tolist()
    assert 7 in d2t.tolist()  # the store's most frequent loss-masked token
    stats = json.loads((result.out / "draft_vocab.json").read_text())
    assert stats["draft_vocab_size"] == 40 and stats["coverage"] == 1.0  # the tiny store has < 40 distinct tokens
    assert result.stats["draft_vocab_size"] == 40

    backbone = AutoModelForCausalLM.from_pretrained(backbone_dir).eval()
    alignment = align_vocab(AutoTokenizer.from_pretrained(backbone_dir), AutoTokenizer.from_pretrained(target_dir))
    tgt_ids = _exact_sequence(alignment, AutoTokenizer.from_pretrained(target_dir), TEXT)
    src_ids = [alignment.exact[t] for t in tgt_ids]
    with torch.no_grad():
        source_TVs = backbone(input_ids=torch.tensor([src_ids])).logits[0]
        expected_TN = alignment.apply(source_TVs.T).T[:, d2t]  # logits are linear in the head rows
        taps = torch.randn(1, len(tgt_ids), cfg.num_taps, cfg.target_hidden_size) * 5
        got_TN = drafter(torch.tensor([tgt_ids]), drafter.fuse_taps(taps))[0]
    torch.testing.assert_close(got_TN, expected_TN, rtol=1e-4, atol=1e-4)


def test_draft_vocab_options_are_checked(pair, tmp_path):
    backbone_dir, target_dir, root = pair
    with pytest.raises(ConfigError, match="--draft-vocab needs --store"):
        ConvertConfig(backbone=backbone_dir, target=str(target_dir), out=tmp_path / "a", draft_vocab_size=10)
    with pytest.raises(ConfigError, match="positive"):
        ConvertConfig(backbone=backbone_dir, store="s", out=tmp_path / "a", draft_vocab_size=0)
    store = make_fake_store(tmp_path / "store", target_dir, taps=(1, 3, 5))
    with pytest.raises(ConfigError, match="exceeds the target vocabulary"):
        run(ConvertConfig(backbone=backbone_dir, store=str(store), target=str(root / "tok"), out=tmp_path / "b",
                          draft_vocab_size=321))
    assert not (tmp_path / "b").exists()
    # N == the whole vocabulary is the full vocabulary: no map, an ordinary Osprey drafter
    from osprey_cli.main import cli

    res = CliRunner().invoke(cli, ["train", "convert", "--backbone", str(backbone_dir), "--store", str(store),
                                   "--target", str(root / "tok"), "--draft-vocab", "320", "--out", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    assert load_drafter(tmp_path / "c").draft_to_target is None


def test_w_c_identity_on_the_deepest_tap_is_an_option_that_keeps_the_function(pair, converted, tmp_path):
    """Issue 34: the authors' public W_c initialisation, beside ours (random). The drafter's function at
    step 0 is the backbone's either way (the condition only enters through zero columns)."""
    backbone, target, _ = pair
    out = run(ConvertConfig(backbone=backbone, target=str(target), out=tmp_path / "id",
                            arch_option=('w_c_init="identity"',))).out
    ident, rand = load_drafter(out), load_drafter(converted.out)
    assert ident.config.arch_options == {"w_c_init": "identity"} and rand.config.arch_options == {}
    w = ident.w_c.weight
    d, dt, taps = ident.config.hidden_size, ident.config.target_hidden_size, ident.config.num_taps
    m = min(d, dt)
    assert torch.equal(w[:m, (taps - 1) * dt:(taps - 1) * dt + m], torch.eye(m))
    assert int(torch.count_nonzero(w)) == m                       # zero on the other taps and dimensions
    # the same function as the random init (zero extra columns), and gradients reach the columns at step 0
    torch.testing.assert_close(_loss(ident), _loss(rand))
    ident.train()
    _loss(ident).backward()
    assert float(ident.model.layers[0].self_attn.q_proj.weight.grad[:, d:].abs().max()) > 0
    with pytest.raises(ConfigError, match="w_c_init must be one of"):
        run(ConvertConfig(backbone=backbone, target=str(target), out=tmp_path / "bad", arch_option=('w_c_init="eye"',)))
    with pytest.raises(ConfigError, match="not an option of the 'osprey' arch"):
        ConvertConfig(backbone=backbone, target=str(target), out=tmp_path / "bad2", arch_option=("block_size=4",))

"""DFlash started from a pre-trained backbone (``convert --arch dflash --backbone``): at initialisation the
block runs through the backbone's own layers, the target's context is silent, and the variant trains,
drafts losslessly and is refused where an engine would compute another model.

Tiny models only: a 2-block prune of the d = 64 Llama (no q/k norms) and of the Qwen3 (q/k norms).
"""

from __future__ import annotations

import json

import pytest
import torch

from osprey_data.errors import ConfigError, InputError
from osprey_data.store import StoreReader
from osprey_train.evaluation.live import run as live
from osprey_train.evaluation.options import LiveConfig
from osprey_train.export import ExportConfig
from osprey_train.export import run as export_run
from osprey_train.models import load_drafter
from osprey_train.stages.convert import STATS_FILE, ConvertConfig
from osprey_train.stages.convert import run as convert
from osprey_train.stages.defaults import distill_optim
from osprey_train.stages.distill import DistillConfig
from osprey_train.stages.distill import run as distill
from osprey_train.stages.prune import PruneConfig
from osprey_train.stages.prune import run as prune
from osprey_train.trainer import LoopConfig
from tests.train.models.tiny_targets import make_fake_store

BLOCK = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_llama_dir):
    return make_fake_store(tmp_path_factory.mktemp("dflash-bb") / "store", tiny_llama_dir, taps=(2, 3, 4), length=24)


@pytest.fixture(scope="module")
def backbones(tmp_path_factory, tiny_llama_dir, tiny_qwen3_dir):
    work = tmp_path_factory.mktemp("backbones")
    return {name: prune(PruneConfig(source=str(src), layers=2, out=work / name)).out
            for name, src in (("llama", tiny_llama_dir), ("qwen3", tiny_qwen3_dir))}


def _convert(store, target, backbone, out, **kw):
    return convert(ConvertConfig(arch="dflash", target=str(target), store=str(store), backbone=backbone, out=out,
                                 arch_option=(f"block_size={BLOCK}",), **kw)).out


def _backbone_block_logits(backbone_dir, ids_B, first_position: int):
    """The HF backbone on the block's tokens, every slot seeing every slot (DFlash's in-block attention)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(backbone_dir, attn_implementation="eager").float().eval()
    b = ids_B.shape[0]
    full_mask = torch.zeros(1, 1, b, b)   # additive: 0 everywhere = non-causal
    positions = torch.arange(first_position, first_position + b)[None]
    with torch.no_grad():
        return model(ids_B[None], position_ids=positions, attention_mask=full_mask).logits[0]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_at_init_the_block_runs_through_the_backbone_and_the_context_is_silent(family, backbones, store,
                                                                              tiny_llama_dir, tmp_path):
    out = _convert(store, tiny_llama_dir, backbones[family], tmp_path / "d")
    model = load_drafter(out)
    assert model.config.arch_options["init"] == "backbone" and model.config.num_layers == 2
    assert model.config.qk_norm is (family == "qwen3")
    assert (out / STATS_FILE).is_file() and json.loads((out / STATS_FILE).read_text())["backbone"]
    assert not model.embed_tokens.weight.requires_grad and not model.lm_head.weight.requires_grad
    sample = StoreReader(str(store)).sample(0)
    ids = torch.as_tensor(sample.token_ids).long()
    taps = torch.as_tensor(sample.hidden_TLD).float()
    context = model.sequence_context(ids, taps)
    assert all(torch.count_nonzero(k) == 0 and torch.count_nonzero(v) == 0 for k, v in context)
    # with no context position allowed, the drafter is the backbone on [anchor, mask x 3], non-causal
    anchor = 9
    block_ids = torch.tensor([int(ids[anchor])] + [model.mask_token_id] * (BLOCK - 1))
    allowed = torch.zeros(1, ids.shape[0], dtype=torch.bool)
    hidden = model.block_hidden(ids[anchor:anchor + 1], torch.tensor([anchor]), BLOCK, context, allowed)
    torch.testing.assert_close(model.logits(hidden)[0].float(),
                               _backbone_block_logits(backbones[family], block_ids, anchor), rtol=1e-4, atol=1e-4)
    # with the context allowed, its zero values only take softmax mass: the output moves, the argmax path
    # of an untrained drafter is not the point; what matters is that it is not the backbone's any more
    with_context = model.context_block_logits(ids, context, torch.tensor([anchor]), BLOCK)
    assert not torch.allclose(with_context[0], model.logits(hidden)[0, 1:].float())


def test_it_trains_the_context_path_and_drafts_losslessly(backbones, store, tiny_llama_dir, tmp_path):
    init = _convert(store, tiny_llama_dir, backbones["llama"], tmp_path / "init")
    loop = LoopConfig(out_dir=tmp_path / "run", max_steps=3, device="cpu", progress=False, log_every=1, save_every=3)
    final = distill(DistillConfig(drafter=init, store=str(store), loop=loop, optim=distill_optim(lr=1e-2),
                                  tokens_per_batch=64)).final_dir
    before, after = load_drafter(init), load_drafter(final)
    assert torch.count_nonzero(after.hidden_norm.weight) > 0   # the silent path opened
    assert torch.equal(before.lm_head.weight, after.lm_head.weight)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "conversations": [{"role": "user", "content": "Count to ten."}]})
                       + "\n", encoding="utf-8")
    report = live(LiveConfig(drafter=str(final), target=str(tiny_llama_dir), inputs=str(prompts), steps=3,
                             max_new_tokens=12, device="cpu", allow_target_mismatch=True, precision="float32"))
    assert all(s["identical"] for s in report.samples), report.samples
    with pytest.raises(ConfigError, match="no per-head q/k norms.*add_qk_norm=true"):
        export_run(ExportConfig(drafter=final, format="vllm", out=tmp_path / "vllm"))
    assert (export_run(ExportConfig(drafter=final, format="hf", out=tmp_path / "hf")).out / "config.json").is_file()


def test_add_qk_norm_makes_a_llama_backbone_servable_and_stays_close_to_it(backbones, store, tiny_llama_dir,
                                                                            tmp_path):
    """--arch-option add_qk_norm=true: the Llama backbone's layers get the engines' per-head q/k norms,
    calibrated to the mean head RMS on the store's text, so that vLLM's and SGLang's DFlashDraftModel
    compute this drafter; at initialisation its block logits stay close to the backbone's, closer than
    with unit norm weights, and the export carries its own embedding and head."""
    from osprey_train.export.vllm import read_vllm

    out = convert(ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), backbone=backbones["llama"],
                                out=tmp_path / "qk", arch_option=(f"block_size={BLOCK}", "add_qk_norm=true"))).out
    model = load_drafter(out)
    assert model.config.family == "qwen3" and model.config.qk_norm and model.config.arch_options["add_qk_norm"]
    norms = [w for layer in model.layers for w in (layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight)]
    assert all(torch.isfinite(w).all() and (w > 0).all() and not torch.allclose(w, torch.ones_like(w)) for w in norms)
    ids = torch.as_tensor(StoreReader(str(store)).sample(0).token_ids).long()
    anchor = 9
    block_ids = torch.tensor([int(ids[anchor])] + [model.mask_token_id] * (BLOCK - 1))
    context = model.sequence_context(ids, torch.as_tensor(StoreReader(str(store)).sample(0).hidden_TLD).float())
    allowed = torch.zeros(1, ids.shape[0], dtype=torch.bool)
    reference = torch.log_softmax(_backbone_block_logits(backbones["llama"], block_ids, anchor), -1)

    @torch.no_grad()
    def kl_to_backbone(m):
        hidden = m.block_hidden(ids[anchor:anchor + 1], torch.tensor([anchor]), BLOCK, context, allowed)
        logq = torch.log_softmax(m.logits(hidden)[0].float(), -1)
        return float((reference.exp() * (reference - logq)).sum(-1).mean())

    calibrated = kl_to_backbone(model)
    for layer in model.layers:
        layer.self_attn.q_norm.weight.data.fill_(1.0)
        layer.self_attn.k_norm.weight.data.fill_(1.0)
    assert calibrated < kl_to_backbone(model), "the calibration brings the drafter closer to the backbone"
    # served: the engine layout carries the drafter's own embedding and head and reads back exactly
    export = export_run(ExportConfig(drafter=out, format="vllm", out=tmp_path / "vllm", dtype="float32")).out
    # calibrated per layer, the k_norm weights differ: the README warns of vLLM's CPU kernel
    assert "## Known issue: vLLM on CPU" in (export / "README.md").read_text()
    back = read_vllm(export)
    original = load_drafter(out)
    for name, tensor in original.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, msg=name)
    assert (export_run(ExportConfig(drafter=out, format="sglang", out=tmp_path / "sglang")).out / "serving.json").is_file()


def test_the_backbone_variant_is_checked(backbones, store, tiny_llama_dir, tmp_path):
    out = _convert(store, tiny_llama_dir, backbones["qwen3"], tmp_path / "q")
    # a Qwen3 backbone's layers are the engines' own: served, with its own embedding and head in the export
    export = export_run(ExportConfig(drafter=out, format="vllm", out=tmp_path / "vllm")).out
    from safetensors import safe_open

    # the export's README warns of vLLM's CPU kernel exactly when the layers' k_norm weights differ
    from osprey_train.drafters.dflash.export import differing_k_norms

    state = load_drafter(out).state_dict()
    names = [n for n in state if n.endswith("self_attn.k_norm.weight")]
    assert differing_k_norms(state) == ("## Known issue" in (export / "README.md").read_text())
    assert not differing_k_norms({n: torch.ones(4) for n in names})
    assert differing_k_norms({n: torch.full((4,), float(i + 1)) for i, n in enumerate(names)}) == (len(names) > 1)

    with safe_open(str(export / "model.safetensors"), framework="pt") as f:
        assert {"embed_tokens.weight", "lm_head.weight"} <= set(f.keys())
    with pytest.raises(ConfigError, match="add_qk_norm gives a Llama backbone"):
        convert(ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), backbone=backbones["qwen3"],
                              out=tmp_path / "q2", arch_option=(f"block_size={BLOCK}", "add_qk_norm=true")))
    with pytest.raises(ConfigError, match="add_qk_norm applies to a drafter converted with --backbone"):
        convert(ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "s",
                              arch_option=("add_qk_norm=true",)))
    with pytest.raises(ConfigError, match="init is written by convert"):
        convert(ConvertConfig(arch="dflash", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "i",
                              arch_option=("init=\"backbone\"",)))
    with pytest.raises(InputError, match="has no config.json"):
        _convert(store, tiny_llama_dir, tmp_path / "nowhere", tmp_path / "n")
    doc = json.loads((out / "config.json").read_text())
    doc["arch_options"]["init"] = "scratch"   # a scratch drafter's embedding is the target's: hidden must match
    doc["hidden_size"] = 32
    (out / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="from scratch uses the target's embedding"):
        load_drafter(out)

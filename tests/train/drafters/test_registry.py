"""The drafter registry's contract, checked for every registered architecture.

Each arch builds a tiny model from its spec, round-trips save/load, runs its training objective
(loss and backward) and its offline drafts through the spec's hooks, and either exports to each
format and reads it back, or refuses that format with a ConfigError before writing anything. A new
architecture folder ``osprey_train/drafters/<name>/`` is covered here without writing a test; the
registry's discovery of the folders is tested at the end.
"""

from __future__ import annotations

import re
import shutil
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from osprey_data.errors import ConfigError, ModelError
from osprey_train.drafters import registry
from osprey_train.drafters.registry import (DRAFTERS, arch_names, discover, drafter_spec, register_drafter,
                                            unregister_drafter)
from osprey_train.drafters.spec import CHAIN_DRAFTS, CHAIN_OBJECTIVE, CHAIN_SESSION, DrafterSpec
from osprey_train.stages.distill import DistillConfig
from osprey_train.trainer import LoopConfig
from osprey_train.evaluation.chain_draft import draft_all_positions
from osprey_train.export import EXPORTERS, ExportConfig, load_export
from osprey_train.export import run as export_run
from osprey_train.models import CausalAttention, Drafter, DrafterConfig, load_drafter, save_drafter
from osprey_train.models.io import build_drafter
from osprey_train.ttt.attention import document_positions
from osprey_train.ttt.loss import VocabMap
from osprey_train.ttt.unroll import PackedBatch, ttt_loss

V, DT, TAPS = 384, 64, 3   # the tiny preset's target: vocabulary, hidden size, taps


def tiny_drafter(name: str, seed: int = 0) -> Drafter:
    """A tiny drafter of arch ``name`` from its spec, every weight random (a draft vocab if it has one)."""
    spec = drafter_spec(name)
    torch.manual_seed(seed)
    model = build_drafter(DrafterConfig.from_name("tiny", arch=name, **spec.tiny))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    if model.config.draft_vocab_size < V:
        model.set_draft_vocab(torch.randperm(V)[: model.config.draft_vocab_size].sort().values)
    return model.eval()


def tiny_batch(seed: int = 1, lengths=(7, 9), k: int = 4) -> PackedBatch:
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    logprobs = torch.log_softmax(torch.randn(1, T, V, generator=g) * 3, -1).topk(k, dim=-1)
    return PackedBatch(input_ids_BT=torch.randint(0, V, (1, T), generator=g), doc_ids_BT=doc,
                       position_ids_BT=document_positions(doc), taps_BTLDt=torch.randn(1, T, TAPS, DT, generator=g),
                       loss_mask_BT=torch.ones(1, T, dtype=torch.bool), topk_ids_BTK=logprobs.indices.int(),
                       topk_logprobs_BTK=logprobs.values)


def logits(model: Drafter, seed: int = 2) -> torch.Tensor:
    """Logits of one forward on fixed inputs: a chain step, or for a block drafter (one that has
    ``block_logits``) the blocks anchored at every position."""
    g = torch.Generator().manual_seed(seed)
    ids, taps = torch.randint(0, V, (1, 6), generator=g), torch.randn(1, 6, TAPS, DT, generator=g)
    if hasattr(model, "block_logits"):
        return model.block_logits(ids[0], taps[0].to(model.lm_head.weight.dtype), torch.arange(6), 3)
    with torch.no_grad():
        hidden = model.forward_hidden(ids, model.fuse_taps(taps.to(model.lm_head.weight.dtype)),
                                      torch.arange(6)[None], CausalAttention())
        return model.logits(hidden).float()


@pytest.fixture(params=arch_names())
def arch(request) -> str:
    return request.param


def test_the_table_holds_the_builtin_archs_and_the_cli_offers_them():
    from osprey_cli.model_cmds import convert

    assert arch_names()[:2] == ("osprey", "eagle3")
    (arch_option,) = [p for p in convert.params if p.name == "arch"]
    assert tuple(arch_option.type.choices) == arch_names() and arch_option.default == arch_names()[0]


def test_references_resolve_to_the_arch_code(arch):
    spec = drafter_spec(arch)
    cls = spec.load("model_class")
    assert issubclass(cls, Drafter) and cls.arch == arch
    assert callable(spec.load("convert"))
    if spec.sglang_reader is not None:
        assert callable(spec.load("sglang_reader")) and spec.sglang_architecture


def test_save_load_round_trip(arch, tmp_path):
    model = tiny_drafter(arch)
    save_drafter(model, tmp_path / "d")
    back = load_drafter(tmp_path / "d")
    assert type(back) is type(model) and back.config == model.config
    assert torch.equal(logits(back), logits(model))


def test_objective_and_offline_drafts_through_the_hooks(arch, tmp_path):
    spec = drafter_spec(arch)
    model = tiny_drafter(arch).train()
    batch = tiny_batch()
    cfg = DistillConfig(drafter=tmp_path / "d", store="unused", loop=LoopConfig(out_dir=tmp_path / "run"),
                        ttt_steps=3, score_out_of_vocab=True)
    objective = spec.load("objective")(model, cfg, None)
    assert objective.drafter is model   # distill saves and evaluates objective.drafter
    loss, metrics = objective(batch)
    loss.backward()
    assert torch.isfinite(loss) and metrics
    assert model.taps_projection().weight.grad.abs().sum() > 0   # the target's taps reach the loss
    model.eval()
    drafts = spec.load("offline_drafts")(model, batch.input_ids_BT[0], batch.taps_BTLDt[0], 3, impl="sdpa")
    assert drafts.shape == (batch.input_ids_BT.shape[1] - 1, 3)
    allowed = set(range(V)) if model.draft_to_target is None else set(model.draft_to_target.tolist())
    assert set(drafts.flatten().tolist()) <= allowed   # drafts are target ids of the draft vocabulary
    assert callable(spec.load("live_session"))


def test_chain_archs_keep_ttt_and_chain_drafts(arch):
    """The chain defaults are what the two built-in archs train and draft with (EAGLE-3's TTT)."""
    if arch not in ("osprey", "eagle3"):
        pytest.skip("a built-in chain arch only")
    spec = drafter_spec(arch)
    assert (spec.objective, spec.offline_drafts, spec.live_session) == (CHAIN_OBJECTIVE, CHAIN_DRAFTS, CHAIN_SESSION)
    model = tiny_drafter(arch)
    out = ttt_loss(model, tiny_batch(), steps=3, vmap=VocabMap.from_drafter(model.draft_to_target, V),
                   score_out_of_vocab=True)
    assert out.metrics["scored_k2"] > 0
    assert spec.load("offline_drafts") is draft_all_positions


@pytest.mark.parametrize("fmt", sorted(EXPORTERS))
def test_export_writes_or_refuses_cleanly(arch, fmt, tmp_path):
    model = tiny_drafter(arch)
    save_drafter(model, tmp_path / "d")
    out = tmp_path / "out"
    if not _serves(arch, fmt):   # refused with the arch's own message, before anything is written
        with pytest.raises(ConfigError) as refusal:
            drafter_spec(arch).check_export(model.config, fmt)
        with pytest.raises(ConfigError, match=re.escape(str(refusal.value))):
            export_run(ExportConfig(drafter=tmp_path / "d", format=fmt, out=out))
        assert not out.exists()
        return
    result = export_run(ExportConfig(drafter=tmp_path / "d", format=fmt, out=out, dtype="float32"))
    assert result.arch == arch
    back = load_export(out, fmt)
    assert back.config.arch == arch
    assert torch.allclose(logits(back), logits(model), atol=1e-5)


def test_the_builtin_export_matrix():
    """What each built-in arch serves: both everywhere; a 2-layer EAGLE-3 not in SGLang (one layer
    there), a Qwen3-family Osprey drafter not in vLLM (its class has no q/k norms)."""
    served = {a: [f for f in sorted(EXPORTERS) if _serves(a, f)] for a in ("osprey", "eagle3")}
    assert served == {"osprey": ["hf", "sglang", "vllm"], "eagle3": ["hf", "sglang", "vllm"]}
    two = DrafterConfig.from_name("tiny-eagle3", num_layers=2)
    with pytest.raises(ConfigError, match="exactly one"):
        drafter_spec("eagle3").check_export(two, "sglang")
    drafter_spec("eagle3").check_export(two, "vllm")
    qwen3 = tiny_drafter("osprey").config.replace(family="qwen3", qk_norm=True)
    with pytest.raises(ConfigError, match="q/k norms"):
        drafter_spec("osprey").check_export(qwen3, "vllm")


def _serves(arch: str, fmt: str) -> bool:
    try:
        drafter_spec(arch).check_export(tiny_drafter(arch).config, fmt)
    except ConfigError:
        return False
    return True


def test_registration_refuses_duplicates_and_bad_names():
    spec = drafter_spec("eagle3")
    with pytest.raises(ConfigError, match="registered twice"):
        register_drafter(spec)
    for bad in ("Eagle-4", "", "4x"):
        with pytest.raises(ConfigError, match="lower-case"):
            register_drafter(DrafterSpec(name=bad, summary="", model_class="m:c", convert="m:c", needs_backbone=False))
    with pytest.raises(ConfigError, match="already 'eagle3'"):
        register_drafter(DrafterSpec(name="copycat", summary="", model_class="m:c", convert="m:c",
                                     needs_backbone=False, sglang_architecture=spec.sglang_architecture))
    assert "copycat" not in DRAFTERS


def test_every_arch_folder_is_registered_under_its_own_name():
    folder = Path(registry.__file__).parent
    folders = sorted(p.parent.name for p in folder.glob("*/arch.py"))
    assert set(folders) <= set(arch_names()) and {"osprey", "eagle3"} <= set(folders)
    assert arch_names()[0] == "osprey"   # the lowest listing_order: the default --arch


def _arch_folder(root: Path, name: str, body: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "arch.py").write_text(body)


def test_discovery_refuses_a_folder_named_otherwise_or_without_a_spec(tmp_path, monkeypatch):
    root = tmp_path / "fake_drafters"
    root.mkdir()
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_line = ("from osprey_train.drafters.spec import DrafterSpec\n"
                 "SPEC = DrafterSpec(name={!r}, summary='', model_class='m:c', convert='m:c', needs_backbone=False)\n")
    _arch_folder(root, "zz_misnamed", spec_line.format("zz_other"))
    with pytest.raises(ModelError, match="an arch folder is named after its arch"):
        discover("fake_drafters", root)
    shutil.rmtree(root / "zz_misnamed")
    _arch_folder(root, "zz_nospec", "X = 1\n")
    with pytest.raises(ModelError, match="defines no SPEC"):
        discover("fake_drafters", root)
    shutil.rmtree(root / "zz_nospec")
    _arch_folder(root, "zz_fine", spec_line.format("zz_fine"))
    (root / "not_an_arch").mkdir()   # a folder without arch.py is not an architecture
    try:
        assert [s.name for s in discover("fake_drafters", root)] == ["zz_fine"]
        assert arch_names()[-1] == "zz_fine" and arch_names()[0] == "osprey"
    finally:
        unregister_drafter("zz_fine")


def test_unknown_arch_is_named_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"'medusa' is not one of \('osprey', 'eagle3'"):
        DrafterConfig.from_name("tiny", arch="medusa")


def test_arch_options_travel_in_config_json_and_unknown_ones_are_refused(arch, tmp_path):
    spec = drafter_spec(arch)
    refusal = "has no arch_options" if arch == "eagle3" else "unknown key"
    with pytest.raises(ConfigError, match=refusal) if arch in ("osprey", "eagle3") or spec.arch_option_keys \
            else nullcontext():
        DrafterConfig.from_name("tiny", arch=arch, **{**spec.tiny, "arch_options": {"bogus": 1}})
    model = tiny_drafter(arch)
    save_drafter(model, tmp_path / "d")
    assert load_drafter(tmp_path / "d").config.arch_options == model.config.arch_options

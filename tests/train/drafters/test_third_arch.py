"""A throwaway third architecture, registered from this test only, runs convert -> distill -> eval -> export.

Nothing outside this file knows ``toy3``: its spec names the model class and the convert entry
defined here, and the stages find them through the registry. This is the check that adding an
architecture needs no edit elsewhere (the registry finds an arch folder by itself; here
``register_drafter`` in a fixture stands for the folder). A second spec, ``toy4``, also names its own
training objective, offline drafts and live session, which distill, acceptance, the engine check's
offline count and live decoding must call instead of the chain defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_data.store import StoreReader
from osprey_train.drafters.eagle3.convert import init_eagle3
from osprey_train.stages.draft_vocab import draft_vocab_from_store
from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.drafters.registry import arch_names, register_drafter, unregister_drafter
from osprey_train.drafters.spec import DrafterSpec
from osprey_train.evaluation.acceptance import evaluate_acceptance, require_tree_drafting
from osprey_train.evaluation.chain_draft import draft_all_positions
from osprey_train.evaluation.live import run as live
from osprey_train.evaluation.live_drafter import DrafterSession
from osprey_train.evaluation.options import LiveConfig
from osprey_train.export import ExportConfig, load_export
from osprey_train.export import run as export_run
from osprey_train.models import load_drafter
from osprey_train.models.io import write_drafter_folder
from osprey_train.stages.convert import ConvertConfig, ConvertResult
from osprey_train.stages.convert import run as convert
from osprey_train.stages.defaults import distill_optim
from osprey_train.stages.distill import DistillConfig, DistillModel
from osprey_train.stages.distill import run as distill
from osprey_train.stages.target_side import resolve_target_side
from osprey_train.study.config import ArmSection
from osprey_train.trainer import LoopConfig
from tests.train.models.tiny_targets import make_fake_store


class ToyDrafter(Eagle3Drafter):
    """The EAGLE-3 body under another name: a new arch with its own class, no new maths."""

    arch = "toy3"


def toy_convert(config: ConvertConfig, cls=ToyDrafter) -> ConvertResult:
    """The EAGLE-3 init, re-labelled as a drafter of ``cls`` (``toy3``)."""
    side = resolve_target_side(target=config.target, store=config.store, taps=None, need_model=True)
    draft_ids, stats = draft_vocab_from_store(config.store, side.identity.vocab_size, config.draft_vocab_size or 64)
    base = init_eagle3(side.model, side.identity, side.taps, draft_ids, seed=config.seed)
    model = cls(base.config.replace(arch=cls.arch))
    model.load_state_dict(base.state_dict())
    write_drafter_folder(model, config.out, tokenizer=side.tokenizer, overwrite=config.overwrite)
    return ConvertResult(out=config.out, stats=stats)


def _needs_target_and_store(config) -> None:
    if config.target is None or config.store is None:
        raise ConfigError("convert --arch toy3 needs --target and --store")


TOY = DrafterSpec(name="toy3", summary="a test-only EAGLE-3 twin", model_class=f"{__name__}:ToyDrafter",
                  convert=f"{__name__}:toy_convert", needs_backbone=False, tiny={"num_layers": 1},
                  check_config=lambda c: None, check_convert=_needs_target_and_store)


@pytest.fixture()
def toy3():
    register_drafter(TOY)
    try:
        yield TOY
    finally:
        unregister_drafter(TOY.name)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_llama_dir) -> Path:
    return make_fake_store(tmp_path_factory.mktemp("toy3") / "store", tiny_llama_dir, taps=(2, 3, 4))


def test_convert_distill_eval_and_export_pick_up_a_registered_arch(toy3, store, tiny_llama_dir, tmp_path):
    assert "toy3" in arch_names()
    ArmSection(name="toy", arch="toy3", stage2="none").check("[[arms]] #1")   # a study arm may use it
    with pytest.raises(ConfigError, match="toy3 needs --target"):
        ConvertConfig(arch="toy3", out=tmp_path / "x", store=str(store))

    init = convert(ConvertConfig(arch="toy3", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "init",
                                 draft_vocab_size=64)).out
    model = load_drafter(init)
    assert type(model) is ToyDrafter and model.config.arch == "toy3" and model.config.draft_vocab_size == 64

    loop = LoopConfig(out_dir=tmp_path / "run", max_steps=2, device="cpu", progress=False, log_every=1)
    result = distill(DistillConfig(drafter=init, store=str(store), loop=loop, optim=distill_optim(lr=1e-3),
                                   tokens_per_batch=96, ttt_steps=2))
    trained = load_drafter(result.final_dir)
    assert type(trained) is ToyDrafter
    assert not torch.equal(trained.fc.weight, model.fc.weight)   # distillation trained it

    report = evaluate_acceptance(trained, StoreReader(str(store)), steps=3, progress=False)
    assert report.num_samples == len(StoreReader(str(store))) and 1.0 <= report.overall <= 4.0

    back = load_export(export_run(ExportConfig(drafter=result.final_dir, format="hf", out=tmp_path / "hf")).out, "hf")
    assert type(back) is ToyDrafter
    for fmt in ("sglang", "vllm"):   # no engine class serves it: refused by the spec's default, nothing written
        with pytest.raises(ConfigError, match=f"no {fmt} model class serves the 'toy3' drafter"):
            export_run(ExportConfig(drafter=result.final_dir, format=fmt, out=tmp_path / fmt))
        assert not (tmp_path / fmt).exists()


CALLS: list[str] = []


class Toy4Drafter(Eagle3Drafter):
    arch = "toy4"


def toy4_objective(drafter, cfg, target_head):
    """The chain objective, recorded: what distill must build for a toy4 drafter."""
    CALLS.append("objective")
    return DistillModel.from_config(drafter, cfg, target_head)


def toy4_drafts(drafter, token_ids_T, hidden_TLDt, steps, *, impl="sdpa"):
    """Chain drafts, recorded: what offline acceptance must draft with."""
    CALLS.append("offline_drafts")
    return draft_all_positions(drafter, token_ids_T, hidden_TLDt, steps, impl=impl)


class Toy4Session(DrafterSession):
    def __init__(self, drafter, **kwargs) -> None:
        CALLS.append("live_session")
        super().__init__(drafter, **kwargs)


def toy4_convert(config: ConvertConfig) -> ConvertResult:
    return toy_convert(config, Toy4Drafter)


TOY4 = DrafterSpec(name="toy4", summary="a test-only arch with its own hooks", model_class=f"{__name__}:Toy4Drafter",
                   convert=f"{__name__}:toy4_convert", needs_backbone=False, tiny={"num_layers": 1},
                   objective=f"{__name__}:toy4_objective", offline_drafts=f"{__name__}:toy4_drafts",
                   live_session=f"{__name__}:Toy4Session", tree_drafting=False, sampled_acceptance=False)


def test_the_stages_call_the_arch_hooks(store, tiny_llama_dir, tmp_path):
    register_drafter(TOY4)
    CALLS.clear()
    try:
        init = convert(ConvertConfig(arch="toy4", target=str(tiny_llama_dir), store=str(store),
                                     out=tmp_path / "init", draft_vocab_size=64)).out
        loop = LoopConfig(out_dir=tmp_path / "run", max_steps=1, device="cpu", progress=False, log_every=1)
        result = distill(DistillConfig(drafter=init, store=str(store), loop=loop, optim=distill_optim(lr=1e-3),
                                       tokens_per_batch=96, ttt_steps=2))
        assert CALLS == ["objective"]
        trained = load_drafter(result.final_dir)
        evaluate_acceptance(trained, StoreReader(str(store)), steps=2, progress=False)
        assert CALLS[-1] == "offline_drafts"
        with pytest.raises(ConfigError, match="'toy4' drafter does not draft"):
            evaluate_acceptance(trained, StoreReader(str(store)), steps=2, progress=False, temperature=1.0)
        with pytest.raises(ConfigError, match="tree drafting expands chain steps"):
            require_tree_drafting(trained, "tree acceptance")
        prompts = tmp_path / "p.jsonl"
        prompts.write_text(json.dumps({"id": "p0", "domain": "chat", "conversations": [
            {"role": "user", "content": "Say something."}]}) + "\n", encoding="utf-8")
        report = live(LiveConfig(drafter=str(result.final_dir), target=str(tiny_llama_dir), inputs=str(prompts),
                                 steps=2, max_new_tokens=4, device="cpu", allow_target_mismatch=True))
        assert "live_session" in CALLS and report.num_prompts == 1
    finally:
        unregister_drafter(TOY4.name)


def test_an_unregistered_arch_is_refused_everywhere(store, tmp_path):
    assert "toy3" not in arch_names()
    with pytest.raises(ConfigError, match="--arch must be one of"):
        ConvertConfig(arch="toy3", out=tmp_path / "x", store=str(store))
    with pytest.raises(ConfigError, match="arch must be one of"):
        ArmSection(name="toy", arch="toy3", stage2="none").check("[[arms]] #1")

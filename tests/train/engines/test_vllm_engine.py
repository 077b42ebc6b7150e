"""Our drafters served by vLLM: the export loads, greedy outputs stay the target's, and vLLM's own
per-position counters equal our offline figure on the same prompts (issue #26).

Runs with ``pytest -m engine`` only (``.ci/run`` has a step of its own), against the vLLM venv made
by ``engines/setup_vllm.sh`` (``$OSPREY_VLLM_VENV`` or ``.venv-vllm``); without it the tests fail,
never skip. Target: SmolLM2-135M-Instruct from the PyPI wheel (cached by ``osprey demo``).

The drafters are made here, in a few CPU minutes, so that vLLM has something to accept:

- **Osprey**: SmolLM2 "pruned" to all of its 30 blocks and converted, so that at initialisation
  it drafts the target's own next tokens, then its zero-initialised condition columns filled with
  small seeded noise, so that the drafts depend on the taps (and W_c) and most of them are still
  accepted. This exercises the Osprey vLLM class (osprey_train/drafters/osprey/vllm_model.py) in every
  position, conditioning included, without a long distillation.
- **EAGLE-3**: converted from a store of the shipped demo prompts with a 2048-token draft
  vocabulary (a ``d2t`` map) and distilled for a few dozen steps.
- **DFlash**: converted from the same store with a block of 4 slots (3 drafts per round, vLLM's
  ``num_speculative_tokens``) and distilled for a few dozen steps; served by vLLM's own
  ``DFlashDraftModel`` (``method: dflash``), no class of ours in the engine.
- **DFlash from the backbone**: SmolLM2 pruned to 2 blocks, converted with ``add_qk_norm`` (the
  engines' per-head q/k norms added to its Llama layers, calibrated) and its own embedding and head
  in the export, distilled as briefly; the same ``DFlashDraftModel`` serves it.

Agreement is exact, per position and round by round: float32 on both sides, greedy, the same token
ids in. A near-tie (two logits within float32 rounding of each other, computed by different kernels)
could flip a draft; none occurs on these prompts, and the report names the prompt and position if
one ever does. Then the
same comparison on deliberately broken exports (the Osprey one with its tap blocks swapped in
``w_c``, the EAGLE-3 one with a shifted ``d2t``) must disagree: the check can fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from osprey_data.builder import BuildConfig
from osprey_data.builder.runner import run as build_store
from osprey_data.target_model.fetch import fetch_smollm2
from osprey_train.engines.engine_eval import EngineEvalConfig
from osprey_train.engines.engine_eval import run as engine_eval
from osprey_train.export import ExportConfig
from osprey_train.export import run as export_run
from osprey_train.stages.configs import ConvertConfig, DistillConfig
from osprey_train.stages.convert import run as convert
from osprey_train.stages.defaults import distill_optim
from osprey_train.stages.distill import run as distill
from osprey_train.stages.prune import PruneConfig
from osprey_train.stages.prune import run as prune
from osprey_train.trainer import LoopConfig
from tests.helpers.engine_drafters import whole_target_osprey

pytestmark = pytest.mark.engine

DEMO_PROMPTS = Path(__file__).resolve().parents[3] / "osprey_train" / "demo" / "prompts.jsonl"
STEPS = 3
MAX_NEW_TOKENS = 32
EVAL_PER_DOMAIN = 1
# Scale of the noise in the Osprey drafter's condition columns: on the 5 eval prompts, offline AL
# (S = 3) is 3.16 with none, 2.92 at 0.003 (2.87 with the tap blocks swapped), 1.01 at 0.01.
NOISE = 0.003


def _split_prompts(work: Path) -> tuple[Path, Path]:
    """The demo's prompts: the first of each domain to evaluate, the rest to train on."""
    records = [json.loads(line) for line in DEMO_PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    seen: dict[str, int] = {}
    evaluate, train = [], []
    for r in records:
        n = seen.get(r["domain"], 0)
        (evaluate if n < EVAL_PER_DOMAIN else train).append(r)
        seen[r["domain"]] = n + 1
    paths = work / "eval.jsonl", work / "train.jsonl"
    for path, rows in zip(paths, (evaluate, train)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    work = tmp_path_factory.mktemp("engine")
    target = fetch_smollm2()
    eval_prompts, train_prompts = _split_prompts(work)
    # Osprey: the whole target as the backbone, conditioning switched on with seeded noise
    osprey_dir = whole_target_osprey(target, work, layers=30, noise=NOISE)

    # EAGLE-3: a reduced draft vocabulary (d2t), briefly distilled
    store = work / "train-store"
    build_store(BuildConfig(target=str(target), inputs=(str(train_prompts),), out=str(store), max_new_tokens=48,
                            limit=32, last_turn_only=True, dtype="float32", device="cpu", progress=False))
    e3_init = convert(ConvertConfig(arch="eagle3", target=str(target), store=str(store), out=work / "e3-init",
                                    draft_vocab_size=2048)).out
    result = distill(DistillConfig(drafter=e3_init, store=str(store), ttt_steps=STEPS, tokens_per_batch=1024,
                                   optim=distill_optim(lr=3e-3),
                                   loop=LoopConfig(out_dir=work / "e3-run", max_steps=30, device="cpu",
                                                   progress=False, plot=False, log_every=10)))
    # DFlash: a block of 4 slots (the anchor and STEPS drafts, vLLM's num_speculative_tokens), briefly distilled
    df_init = convert(ConvertConfig(arch="dflash", target=str(target), store=str(store), out=work / "df-init",
                                    arch_option=(f"block_size={STEPS + 1}", "anchor_fraction=1.0"))).out
    dflash = distill(DistillConfig(drafter=df_init, store=str(store), tokens_per_batch=1024,
                                   optim=distill_optim(lr=3e-3),
                                   loop=LoopConfig(out_dir=work / "df-run", max_steps=40, device="cpu",
                                                   progress=False, plot=False, log_every=10)))
    # DFlash from the pruned SmolLM2 (2 blocks), its Llama layers given the engines' q/k norms
    backbone = prune(PruneConfig(source=str(target), layers=2, out=work / "pruned")).out
    bb_init = convert(ConvertConfig(arch="dflash", target=str(target), store=str(store), backbone=backbone,
                                    out=work / "dfb-init", arch_option=(f"block_size={STEPS + 1}", "anchor_fraction=1.0",
                                                                        "add_qk_norm=true"))).out
    dflash_bb = distill(DistillConfig(drafter=bb_init, store=str(store), tokens_per_batch=1024,
                                      optim=distill_optim(lr=3e-3),
                                      loop=LoopConfig(out_dir=work / "dfb-run", max_steps=40, device="cpu",
                                                      progress=False, plot=False, log_every=10)))
    return {"work": work, "target": target, "eval": eval_prompts, "osprey": osprey_dir, "eagle3": result.final_dir,
            "dflash": dflash.final_dir, "dflash-backbone": dflash_bb.final_dir}


def _export(drafter: Path, out: Path) -> Path:
    return export_run(ExportConfig(drafter=drafter, format="vllm", out=out, dtype="float32")).out


def _broken(export: Path, out: Path, change) -> Path:
    """A copy of ``export`` whose weights ``change`` edits in place."""
    out.mkdir()
    for f in export.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    state = load_file(str(export / "model.safetensors"))
    change(state)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _swap_tap_blocks(state: dict) -> None:
    w = state["w_c.weight"]
    width = w.shape[1] // 3
    state["w_c.weight"] = torch.cat([w[:, 2 * width:], w[:, width:2 * width], w[:, :width]], dim=1).contiguous()


def _swap_fc_tap_blocks(state: dict) -> None:
    """The DFlash export's ``fc`` reading its low and high taps in each other's place."""
    w = state["fc.weight"]
    width = w.shape[1] // 3
    state["fc.weight"] = torch.cat([w[:, 2 * width:], w[:, width:2 * width], w[:, :width]], dim=1).contiguous()


def _shift_d2t(state: dict) -> None:
    """Every draft id mapped to its neighbour's target id (``d2t`` holds offsets: target = i + d2t[i])."""
    offsets = state["d2t"]
    index = torch.arange(offsets.numel(), dtype=offsets.dtype)
    state["d2t"] = (torch.roll(index + offsets, 1) - index).contiguous()


def _check(setup, arch: str, break_export) -> None:
    work = setup["work"]
    good = _export(setup[arch], work / f"{arch}-vllm")
    bad = _broken(good, work / f"{arch}-vllm-broken", break_export)
    report = engine_eval(EngineEvalConfig(engine="vllm", drafter=setup[arch], target=str(setup["target"]),
                                          inputs=(str(setup["eval"]),), out=work / f"{arch}-engine", steps=STEPS,
                                          max_new_tokens=MAX_NEW_TOKENS, exports=(good, bad), live=False,
                                          progress=False))
    ok, broken = report.exports
    n = report.num_prompts
    assert ok.agrees, (work / f"{arch}-engine" / "report.md").read_text()
    assert ok.identical == {"spec_vs_plain": n, "plain_vs_store": n}
    assert ok.engine_reconciled == ok.offline_per_pos and ok.engine_rounds == ok.offline_rounds
    # round by round too: vLLM's counters read after every engine step (issue 33)
    assert ok.per_round_prompts == n and ok.per_round_agreeing == n
    assert all(p["engine_per_round"] is not None for p in ok.prompts)
    assert ok.offline_per_pos[0] > 0, f"{arch}: nothing accepted, the comparison would check little"
    # the broken export is still lossless (verification keeps the target's tokens) but drafts
    # something else: its counters leave our figure
    assert not broken.agrees and broken.identical["spec_vs_plain"] == n
    assert broken.engine_reconciled != broken.offline_per_pos
    assert broken.per_round_agreeing < n and any(p["first_round_differing"] for p in broken.prompts)


def test_osprey_drafter_served_by_vllm_matches_offline_and_a_wrong_tap_order_is_caught(setup):
    _check(setup, "osprey", _swap_tap_blocks)


def test_eagle3_drafter_served_by_vllm_matches_offline_and_a_wrong_d2t_is_caught(setup):
    _check(setup, "eagle3", _shift_d2t)


def test_dflash_drafter_served_by_vllm_matches_offline_and_a_wrong_tap_order_is_caught(setup):
    """vLLM's own DFlashDraftModel loads our export unchanged; its rounds and per-position accepted
    counts equal our offline block walk prompt by prompt (float32), and swapped taps disagree."""
    _check(setup, "dflash", _swap_fc_tap_blocks)


def test_dflash_from_the_backbone_with_added_qk_norms_is_served_by_vllm_losslessly(setup):
    """A DFlash drafter started from the pruned SmolLM2 with add_qk_norm: vLLM's DFlashDraftModel loads the
    export (its own embedding and head included), decodes losslessly, and its rounds equal our offline
    block walk on all but at most one prompt.

    Not exact, unlike the three drafters above: on one prompt vLLM accepted a draft ours did not, at a
    margin of 0.0084 between the two candidates. The cause is vLLM's CPU ``rms_norm``, which gives
    every layer's context keys layer 0's ``k_norm`` weight (test_vllm_kernels.py pins it), while the
    calibrated norms differ per layer; with per-layer calls patched into vLLM by hand, all 5 prompts
    agree. When test_vllm_kernels.py fails (vLLM fixed), demand ``per_round_agreeing == n`` here. Its
    tap path is still almost silent after 40 steps, so a swapped-taps export drafts the same and is no
    check here."""
    work = setup["work"]
    export = _export(setup["dflash-backbone"], work / "dflash-backbone-vllm")
    report = engine_eval(EngineEvalConfig(engine="vllm", drafter=setup["dflash-backbone"], target=str(setup["target"]),
                                          inputs=(str(setup["eval"]),), out=work / "dflash-backbone-engine",
                                          steps=STEPS, max_new_tokens=MAX_NEW_TOKENS, exports=(export,), live=False,
                                          progress=False))
    (ok,) = report.exports
    n = report.num_prompts
    assert ok.identical == {"spec_vs_plain": n, "plain_vs_store": n}, (work / "dflash-backbone-engine" / "report.md")
    assert ok.counters_consistent == n and ok.per_round_prompts == n
    assert ok.per_round_agreeing >= n - 1, (work / "dflash-backbone-engine" / "report.md").read_text()

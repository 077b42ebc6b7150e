"""Our drafters decoding in SGLang on CUDA (PyPI ``sglang``; issue #26): greedy output is lossless
and SGLang's own per-request accept counts equal our offline figure on the same prompts.

``gpu``: skipped without CUDA; ``sglang``: skipped where the sglang extra is not installed (as the
other CUDA SGLang test, tests/train/export). The CPU rig cannot check this: its speculative path
is wrong at that snapshot (../shared/wheels/README.md; test_sglang_exports.py checks what the CPU
can: both exports load in SGLang's classes and their draft forward runs). Not yet run on a GPU;
its plumbing (the engine calls, the ``meta_info`` fields, the comparison) was run once by hand on
the CPU rig with bf16 engine settings, where it reached the comparison and reported a difference
on one prompt, as expected there.

Setup, tiny and fast: a random Llama target (4 heads of 64); an **Osprey** drafter that is the
whole target converted (so it drafts the target's own next tokens) with seeded noise in its
condition columns (so its drafts depend on the taps and W_c and are not all accepted); an
**EAGLE-3** drafter converted from a store of the prompts (random, with a reduced draft
vocabulary: the ``d2t`` path); a **DFlash** drafter (issue 44) converted from the same store with
block ``S + 1``, served by SGLang's own ``DFlashDraftModel`` (``--speculative-algorithm DFLASH
--speculative-num-draft-tokens S+1``; its offline walk drafts one block per round). All exported
with ``osprey export --format sglang`` in float32.

Per export, on the same prompt ids (rendered on our side, as ``osprey eval engine`` does): SGLang
decodes greedily without and with ``--speculative-algorithm EAGLE3`` (S=3 steps, top-k 1, S+1
draft tokens), float32 (``triton`` attention: FlashInfer has no float32).

- **lossless**: speculative output == plain output == the store's response (transformers, float32),
  token for token, per prompt;
- **acceptance**: SGLang's ``meta_info`` per request: ``spec_verify_ct`` (verify rounds) and
  ``spec_accept_histogram`` (alias ``spec_correct_drafts_histogram``; entry k = rounds with k
  accepted drafts, bonus token excluded) give accepted drafts per position ``s`` = rounds with
  more than ``s`` accepted. They must equal our offline walk (``acceptance_walk`` on the store,
  as osprey_train/engines/engine_eval.py does for vLLM) under :func:`reconcile`'s rule (ours =
  the engine's minus drafts counted past the end of a request, if SGLang counts any).

Exact in float32 up to near-ties (two logits within float32 rounding, from different kernels);
a mismatch names the prompt and the first differing token.

Then the same through the command, ``osprey eval engine --engine sglang --device cuda --dtype
float32`` (:func:`osprey_train.engines.engine_eval.run`, with this interpreter's environment as
the engine's venv): its own store, walk and live harness, one driver process decoding plain and
speculative, single-stream and batched; the report must say lossless and agree per prompt with
offline and live, exactly, as the vLLM engine test asserts on CPU.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from osprey_data.builder import BuildConfig
from osprey_data.builder.runner import run as build_store
from osprey_data.conversation import stop_token_ids
from osprey_data.store import StoreReader
from osprey_train.engines.compare import first_difference, reconcile
from osprey_train.engines.engine_eval import EngineEvalConfig
from osprey_train.engines.engine_eval import run as engine_eval
from osprey_train.evaluation.acceptance import acceptance_walk, has_verify_round, offline_drafts
from osprey_train.evaluation.live_prompts import load_prompts
from osprey_train.export import ExportConfig
from osprey_train.export import run as export_run
from osprey_train.models import load_drafter
from osprey_train.stages.configs import ConvertConfig
from osprey_train.stages.convert import run as convert
from tests.helpers.engine_drafters import whole_target_osprey
from tests.helpers.tiny import make_tiny_llama

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]

STEPS = 3
NEW_TOKENS = 24
TAPS = (1, 3, 4)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_tokenizer):
    from tests.data.conftest import PROMPTS as RECORDS
    from tests.data.conftest import write_jsonl

    work = tmp_path_factory.mktemp("sglang_gpu")
    target = make_tiny_llama(work / "target", tiny_tokenizer, hidden_size=256)
    inputs = write_jsonl(work / "prompts.jsonl", RECORDS)
    store = work / "store"
    build_store(BuildConfig(target=str(target), inputs=(str(inputs),), out=str(store), max_new_tokens=NEW_TOKENS,
                            temperature=0.0, layers=TAPS, last_turn_only=True, dtype="float32", device="cpu",
                            topk=8, batch_size=4, progress=False))
    drafters = {"osprey": whole_target_osprey(target, work, layers=6, noise=0.005, taps=TAPS),
                "eagle3": convert(ConvertConfig(arch="eagle3", target=str(target), store=str(store),
                                                draft_vocab_size=128, out=work / "eagle3")).out,
                # issue 44: block STEPS + 1, so SGLang's DFLASH verifies the STEPS drafts the others do
                "dflash": convert(ConvertConfig(arch="dflash", target=str(target), store=str(store),
                                                arch_option=(f"block_size={STEPS + 1}",), out=work / "dflash")).out}
    return {"work": work, "target": target, "inputs": inputs, "store": store, "drafters": drafters}


def _offline(drafter_dir: Path, store: Path) -> dict[str, dict]:
    """Per sample id: prompt and response ids of the store, and our offline walk of the drafter."""
    drafter = load_drafter(drafter_dir).eval()
    draft = offline_drafts(drafter)   # the arch's own: chain steps, or one DFlash block per round
    reader = StoreReader(str(store))
    out = {}
    for i in range(len(reader)):
        s = reader.sample(i, as_torch=True)
        ids = s.token_ids.tolist()
        walk = []
        if has_verify_round(s):
            drafts = draft(drafter, s.token_ids, s.hidden_TLD.float(), STEPS).cpu()
            walk = acceptance_walk(ids, s.prompt_length, drafts.tolist())
        out[s.sample_id] = {"prompt_ids": ids[:s.prompt_length], "response_ids": ids[s.prompt_length:], "walk": walk}
    return out


def _generate(target: Path, prompts: list[list[int]], stops: list[int], **speculative) -> list[dict]:
    import sglang

    engine = sglang.Engine(model_path=str(target), skip_tokenizer_init=True, dtype="float32",
                           attention_backend="triton", disable_cuda_graph=True, mem_fraction_static=0.2,
                           random_seed=0, log_level="error", custom_sigquit_handler=signal.SIG_IGN, **speculative)
    try:
        return engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0.0,
                                                                   "stop_token_ids": stops})
    finally:
        engine.shutdown()


def _strip_stop(ids: list[int], stops: set[int]) -> list[int]:
    # SGLang versions differ on whether output_ids keep the matched stop token; the store keeps it
    return ids[:-1] if ids and ids[-1] in stops else ids


def _speculative_args(arch: str, export: Path) -> dict:
    if arch == "dflash":   # SGLang's own DFlashDraftModel; one step, top-k 1, the block as draft tokens
        return {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": str(export),
                "speculative_num_draft_tokens": STEPS + 1}
    return {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(export),
            "speculative_num_steps": STEPS, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": STEPS + 1}


@pytest.mark.parametrize("arch", ["osprey", "eagle3", "dflash"])
def test_sglang_decoding_is_lossless_and_accepts_what_we_measure_offline(setup, arch, monkeypatch):
    pytest.importorskip("sglang")
    from transformers import AutoTokenizer

    if arch == "osprey":
        monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "osprey_train.drafters.osprey.sglang")
    work, target = setup["work"], setup["target"]
    tokenizer = AutoTokenizer.from_pretrained(target)
    stops = sorted(stop_token_ids(tokenizer))
    prompts = load_prompts((str(setup["inputs"]),), tokenizer)
    offline = _offline(setup["drafters"][arch], setup["store"])
    for p in prompts:
        assert offline[p.sample_id]["prompt_ids"] == p.prompt_ids, p.sample_id
    export = export_run(ExportConfig(drafter=setup["drafters"][arch], format="sglang", out=work / f"{arch}-sglang",
                                     dtype="float32", overwrite=True)).out
    ids = [p.prompt_ids for p in prompts]
    plain = _generate(target, ids, stops)
    spec = _generate(target, ids, stops, **_speculative_args(arch, export))
    problems, accepted = [], 0
    for p, a, b in zip(prompts, plain, spec):
        ours = offline[p.sample_id]
        want = _strip_stop(ours["response_ids"], set(stops))
        got_plain, got_spec = (_strip_stop([int(t) for t in o["output_ids"]], set(stops)) for o in (a, b))
        if got_plain != want:
            problems.append(f"{p.sample_id}: plain output leaves the store's at token {first_difference(got_plain, want)}")
        if got_spec != got_plain:
            problems.append(f"{p.sample_id}: speculative output leaves plain at token "
                            f"{first_difference(got_spec, got_plain)} (not lossless)")
        meta = b["meta_info"]
        rounds = meta.get("spec_verify_ct", 0)  # absent when a request had no verify round
        hist = meta.get("spec_accept_histogram") or meta.get("spec_correct_drafts_histogram") or []
        per_pos = [sum(hist[k + 1:]) for k in range(STEPS)]
        row = reconcile(sample_id=p.sample_id, domain=p.domain, steps=STEPS, tokens=len(got_spec),
                        engine={"num_drafts": rounds, "accepted_per_pos": per_pos}, walk=ours["walk"])
        accepted += sum(row.offline_per_pos)
        if not row.agrees:
            problems.append(f"{p.sample_id}: {row.why} (SGLang {per_pos} in {rounds} rounds, ours "
                            f"{row.offline_per_pos} in {row.offline_rounds})")
    assert not problems, json.dumps(problems, indent=1)
    if arch == "osprey":  # the target's own layers draft: acceptance must be far from zero to check much
        assert accepted > 0


@pytest.mark.parametrize("arch", ["osprey", "eagle3"])
def test_eval_engine_sglang_on_cuda_is_lossless_and_equals_offline_and_live_per_prompt(setup, arch):
    pytest.importorskip("sglang")
    out = setup["work"] / f"{arch}-engine"
    report = engine_eval(EngineEvalConfig(engine="sglang", device="cuda", dtype="float32",
                                          drafter=setup["drafters"][arch], target=str(setup["target"]),
                                          inputs=(str(setup["inputs"]),), out=out, steps=STEPS,
                                          max_new_tokens=NEW_TOKENS, venv=sys.prefix, max_model_len=512,
                                          progress=False, store_overrides={"topk": 8, "batch_size": 4}))
    (e,) = report.exports
    n = report.num_prompts
    assert report.agrees and e.lossless, (out / "report.md").read_text()
    assert e.identical == {"spec_vs_plain": n, "plain_vs_store": n, "live_vs_plain": n}
    assert e.prompts_comparable == n == e.comparable_agreeing == e.counters_consistent
    assert e.engine_reconciled == e.offline_per_pos == e.live_per_pos
    assert e.engine_rounds == e.offline_rounds == e.live_rounds
    # batched: SGLang's per-request counters there too (a batch may round otherwise: consistency only)
    assert e.batched is not None and e.batched["counters_consistent"] == n
    if arch == "osprey":
        assert e.offline_per_pos[0] > 0, "nothing accepted: the comparison would check little"

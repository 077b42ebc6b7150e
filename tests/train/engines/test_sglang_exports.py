"""Our two drafter exports inside SGLang's engine, on CPU (issue #26): they load in SGLang's own
model classes and SGLang's EAGLE-3 worker runs their draft forward; a broken export fails to load.

Runs with ``pytest -m sglang_cpu`` only, in the venv ``.ci/sglang_venv.sh`` makes from the SGLang
CPU rig (``../shared/wheels``); without SGLang the tests fail, never skip. On a CPU without Intel
AMX SGLang's CPU engine cannot run EAGLE drafters (``SGLANG_CPU_NEEDS_AMX``): it builds the draft
model, then refuses at attention setup. There the two speculating tests are replaced by their
no-AMX twins, which check the load (the draft model built as the right class) and that refusal;
the truncated-export test runs everywhere (the load fails first).

For each architecture a tiny random drafter for a tiny random Llama target (4 heads of 64: SGLang's
CPU attention kernels refuse head size 16) is exported with ``osprey export --format sglang`` in
bf16 (SGLang's CPU kernels have no float32) and served as ``--speculative-algorithm EAGLE3``
(2 draft steps, top-k 1, 3 draft tokens; ``intel_amx`` attention, no overlap scheduler):

- **Osprey** -> our external class ``OspreyDrafterForCausalLM`` (``osprey_train/drafters/osprey/sglang/model.py``),
  found through ``SGLANG_EXTERNAL_MODEL_PACKAGE=osprey_train.drafters.osprey.sglang``;
- **EAGLE-3** -> SGLang's stock ``LlamaForCausalLMEagle3``.

Both drafters have a reduced draft vocabulary, so the ``d2t`` -> ``hot_token_id`` path loads too.

What is checked: the export's ``config.json`` names that class; SGLang's model runner reports
building the draft model as that class (its ``Load weight end ... type=<class>`` log line of the
scheduler process, read from the captured stderr: the model object lives in that process, out of
reach of the test); every request produces its tokens and SGLang's own per-request counters
(``meta_info``) show verify rounds (``spec_verify_ct`` >= 1, and the histogram of accepted drafts,
filled once per verified round, covers exactly those rounds): SGLang's EAGLE worker drafts with
the draft model before each verify, so its forward ran. (``spec_num_proposed_drafts`` is not
evidence: SGLang computes it as rounds x (draft tokens - 1).) A truncated Osprey export (one tensor removed)
must make the engine refuse to start, with our class's reason in the log: the load is checked,
not trusted. (Seen once by hand, not tested, to save an engine start: an EAGLE-3 export whose
config.json halves ``hidden_size`` fails in SGLang's own ``LlamaForCausalLMEagle3.load_weights``
with "The size of tensor a (128) must match the size of tensor b (256)".)

What is NOT checked here, and why: that speculative output equals plain output and that SGLang's
accepted drafts equal our offline figure. SGLang's CPU speculative path is wrong at the rig's
snapshot (../shared/wheels/README.md: with EAGLE-3 on, the verified greedy output leaves the plain
output after 1-3 tokens and depends on the drafter), so those numbers check nothing on CPU; the
``gpu`` test in ``test_sglang_gpu.py`` checks both with the PyPI ``sglang`` on CUDA.
"""

from __future__ import annotations

import gc
import json
import os
import signal

import psutil
import pytest
import torch
from click.testing import CliRunner
from osprey_cli.main import cli
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from osprey_data.target_model import TapLayers, identify_target
from osprey_train.engines.engine_eval import SGLANG_CPU_NEEDS_AMX, cpu_has_amx
from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.models import DrafterConfig, save_drafter
from tests.helpers.tiny import make_tiny_llama

pytestmark = pytest.mark.sglang_cpu

STEPS = 2
NEW_TOKENS = 8
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]
CLASSES = {"osprey": "OspreyDrafterForCausalLM", "eagle3": "LlamaForCausalLMEagle3"}
DRAFT_VOCAB = 256


def sglang_engine(target, export, **extra):
    """SGLang's offline engine on the CPU rig with ``export`` as the EAGLE-3 draft model.

    SIGQUIT is ignored in this process: SGLang's default handler (a failing child signals the
    parent) kills the whole process tree, pytest included, instead of letting ``Engine`` raise.
    """
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # read when sglang is imported
    import sglang

    return sglang.Engine(
        model_path=str(target), speculative_algorithm="EAGLE3", speculative_draft_model_path=str(export),
        speculative_num_steps=STEPS, speculative_eagle_topk=1, speculative_num_draft_tokens=STEPS + 1,
        device="cpu", dtype="bfloat16", attention_backend="intel_amx", disable_overlap_schedule=True,
        skip_tokenizer_init=True, max_total_tokens=4096, random_seed=0, log_level="info",
        custom_sigquit_handler=signal.SIG_IGN, **extra)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_tokenizer):
    """The target and both exports (``osprey export --format sglang --dtype bfloat16``)."""
    root = tmp_path_factory.mktemp("sglang_exports")
    target = make_tiny_llama(root / "target", tiny_tokenizer, hidden_size=256)
    identity = identify_target(AutoModelForCausalLM.from_pretrained(target), tiny_tokenizer, str(target))
    shape = dict(target=identity, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, vocab_size=identity.vocab_size, draft_vocab_size=DRAFT_VOCAB, target_hidden_size=256,
                 tap_layers=TapLayers(layer_ids=(1, 3, 4)))
    torch.manual_seed(0)
    drafters = {"eagle3": Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", **shape)),
                "osprey": OspreyDrafter(DrafterConfig.from_name("tiny", **shape))}
    out = {"target": target}
    for arch, model in drafters.items():
        model.set_draft_vocab(torch.arange(identity.vocab_size - DRAFT_VOCAB, identity.vocab_size))
        folder = save_drafter(model, root / arch)
        res = CliRunner().invoke(cli, ["export", "--drafter", str(folder), "--format", "sglang", "--dtype", "bfloat16",
                                       "--out", str(root / f"{arch}-sglang")])
        assert res.exit_code == 0, res.output
        out[arch] = root / f"{arch}-sglang"
    return out


def _use_external_class(monkeypatch, arch):
    # only the Osprey drafter needs our package registered; EAGLE-3 is SGLang's own class
    if arch == "osprey":
        monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "osprey_train.drafters.osprey.sglang")
    else:
        monkeypatch.delenv("SGLANG_EXTERNAL_MODEL_PACKAGE", raising=False)


@pytest.mark.skipif(not cpu_has_amx(), reason=SGLANG_CPU_NEEDS_AMX)
@pytest.mark.parametrize("arch", ["osprey", "eagle3"])
def test_export_loads_in_sglangs_class_and_drafts_every_round(exports, arch, monkeypatch, capfd):
    config = json.loads((exports[arch] / "config.json").read_text())
    assert config["architectures"] == [CLASSES[arch]]
    _use_external_class(monkeypatch, arch)
    engine = sglang_engine(exports["target"], exports[arch])
    try:
        outs = engine.generate(input_ids=PROMPTS, sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0.0})
    finally:
        engine.shutdown()
    log = capfd.readouterr().err
    built = [line for line in log.splitlines() if "Load weight end" in line]
    assert len(built) == 2 and f"type={CLASSES[arch]}," in built[1], "\n".join(built)  # target, then draft
    assert len(outs) == len(PROMPTS)
    for out in outs:
        meta = out["meta_info"]
        assert len(out["output_ids"]) == NEW_TOKENS and meta["completion_tokens"] == NEW_TOKENS, meta
        rounds = meta["spec_verify_ct"]
        assert rounds >= 1, meta
        assert sum(meta["spec_accept_histogram"]) == rounds, meta


def _failed_start(target, export, capfd, match: str) -> str:
    """Start the engine, expect it to die during initialisation; return the captured stderr."""
    import zmq  # SGLang's dependency, in its venv

    children = {p.pid for p in psutil.Process().children(recursive=True)}
    before = {id(o) for o in gc.get_objects() if isinstance(o, (zmq.Context, zmq.Socket))}
    try:
        with pytest.raises(RuntimeError, match=match):
            sglang_engine(target, export)
    finally:
        # A failed start is not cleaned up by SGLang: its detokenizer keeps running, and the ZMQ
        # contexts and sockets it opened block this process's exit forever (Context.__del__ ->
        # term, seen; a socket left open on the shared Context.instance() blocks it too, seen).
        for p in psutil.Process().children(recursive=True):
            if p.pid not in children and p.name().startswith("sglang::"):
                p.kill()
        opened = [o for o in gc.get_objects() if isinstance(o, (zmq.Context, zmq.Socket)) and id(o) not in before]
        for sock in (o for o in opened if isinstance(o, zmq.Socket)):
            sock.close(linger=0)
        for ctx in (o for o in opened if isinstance(o, zmq.Context)):
            ctx.destroy(linger=0)
    return capfd.readouterr().err


@pytest.mark.skipif(cpu_has_amx(), reason="on a CPU with AMX the engine starts: the test above runs instead")
@pytest.mark.parametrize("arch", ["osprey", "eagle3"])
def test_without_amx_the_export_still_loads_in_sglangs_class_before_the_engine_refuses(exports, arch, monkeypatch,
                                                                                        capfd):
    """SGLang builds the draft model (our class's ``load_weights`` runs) before it sets up attention,
    where a CPU without AMX stops it: the load is checked on every CPU."""
    _use_external_class(monkeypatch, arch)
    err = _failed_start(exports["target"], exports[arch], capfd, "scheduler died during initialization")
    built = [line for line in err.splitlines() if "Load weight end" in line]
    assert len(built) == 2 and f"type={CLASSES[arch]}," in built[1], "\n".join(built)  # target, then draft
    assert "EAGLE is not supported in decode attention backend torch_native" in err, err[-3000:]


def test_truncated_osprey_export_fails_to_load_with_the_reason(exports, tmp_path, monkeypatch, capfd):
    """One tensor removed: our class's ``load_weights`` refuses (SGLang would leave the parameter
    uninitialised and serve garbage drafts, still lossless, so nothing else would notice)."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in exports["osprey"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    state = load_file(str(broken / "model.safetensors"))
    state.pop("model.layers.1.self_attn.k_proj.weight")
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    _use_external_class(monkeypatch, "osprey")
    err = _failed_start(exports["target"], broken, capfd, "scheduler died during initialization")
    assert "the checkpoint lacks 1 tensor(s) the model needs (model.layers.1.self_attn.k_proj.weight)" in err, err[-3000:]

"""Interop with the reference implementation a vLLM user loads EAGLE-3 drafters with: ``speculators``.

A tiny EAGLE-3 drafter is converted from a real builder store, distilled a few steps and exported
with ``osprey export --format vllm``, all through the CLI. The export is then loaded with
speculators' own ``Eagle3DraftModel`` (eager attention: its flex path needs padded lengths on CPU)
and run through speculators' own training forward, fed by speculators' own ``shift_batch``
(the engine layout: ``input_ids[1:]`` paired with ``hidden_states[:-1]``). Nothing of ours runs
on their side, so these tests fail when our export, our layout or our TTT unroll drift from
theirs:

(a) no missing or unexpected tensors beyond the verifier norm/head speculators fills itself, and
    every tensor loads bit-identical;
(b) first-step logits equal ours to 1e-5 (fp32) on one document;
(c) per-TTT-step logits on a packed batch of three documents equal ours to 1e-5 at every slot
    whose chain stays inside its document (speculators teacher-forces across document
    boundaries where we pad; those slots are scored by neither);
(d) the tap ids speculators resolves against the verifier equal ours.

Run with ``python -m pytest -m interop`` in an environment with the ``interop`` extra and
``pip install --no-deps speculators==0.9.0`` (see README); ``.ci/run`` does it in a second venv.
The tests fail, never skip, when speculators is missing.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.store import StoreReader
from osprey_train.distill_data.packing import pack_samples
from osprey_train.models import load_drafter
from osprey_train.ttt.unroll import step_valid, ttt_hidden_states
from tests.train.evaluation.store_util import make_store

pytestmark = pytest.mark.interop

TAPS = (2, 3, 4)
TTT_STEPS = 3
TOL = 1e-5


def _speculators():
    try:
        import speculators  # noqa: F401
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig, shift_batch
    except ImportError as exc:  # fail, never skip: CI must notice a broken interop environment
        pytest.fail(f"the interop tests need the speculators package ({exc}); install it with "
                    "`pip install -e '.[interop]' && pip install --no-deps speculators==0.9.0`")
    return Eagle3DraftModel, Eagle3SpeculatorConfig, shift_batch


def _invoke(args):
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_llama_dir):
    """Store -> convert --arch eagle3 -> distill (3 steps) -> export --format vllm, via the CLI."""
    root = tmp_path_factory.mktemp("interop")
    store = make_store(root / "store", tiny_llama_dir, num_samples=6, max_new_tokens=12, taps=TAPS)
    _invoke(["train", "convert", "--arch", "eagle3", "--target", str(tiny_llama_dir), "--store", str(store),
             "--draft-vocab-size", "128", "--out", str(root / "init")])
    _invoke(["train", "distill", "--drafter", str(root / "init"), "--store", str(store), "--out", str(root / "run"),
             "--steps", "3", "--ttt-steps", str(TTT_STEPS), "--tokens-per-batch", "256", "--lr", "1e-3",
             "--device", "cpu", "--attention", "sdpa", "--no-progress"])
    _invoke(["export", "--drafter", str(root / "run" / "final"), "--format", "vllm", "--dtype", "float32",
             "--out", str(root / "vllm")])
    ours = load_drafter(root / "run" / "final").eval()
    return {"store": StoreReader(str(store)), "ours": ours, "export": root / "vllm", "target": tiny_llama_dir}


@pytest.fixture(scope="module")
def theirs(exported):
    Eagle3DraftModel, Eagle3SpeculatorConfig, _ = _speculators()
    config = Eagle3SpeculatorConfig.from_pretrained(str(exported["export"]))
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel.from_pretrained(str(exported["export"]), config=config, dtype=torch.float32)
    return model.eval()


def _their_batch(samples, shift_batch):
    """speculators' packed batch: each document through their own shift_batch, then concatenated."""
    docs = []
    for s in samples:
        T = s.token_ids.shape[0]
        docs.append(shift_batch({
            "input_ids": s.token_ids.long(),
            "hidden_states": s.hidden_TLD.float().reshape(T, -1),
            "verifier_last_hidden_states": torch.zeros(T, s.hidden_TLD.shape[-1]),
            "loss_mask": s.loss_mask.bool(),
            "lengths": torch.tensor([T]),
            "position_ids": torch.arange(T),
        }))
    lengths = torch.cat([d["lengths"] for d in docs])
    return {"input_ids": torch.cat([d["input_ids"] for d in docs])[None],
            "hidden_states": torch.cat([d["hidden_states"] for d in docs])[None],
            "position_ids": torch.cat([d["position_ids"] for d in docs])[None],
            "document_ids": torch.repeat_interleave(torch.arange(len(docs)), lengths)[None]}


@torch.no_grad()
def _their_step_logits(model, batch, steps):
    """Logits of every TTT step of speculators' own forward (captured at its LM head)."""
    logits = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: logits.append(out.detach().clone()))
    try:
        model(hidden_states=batch["hidden_states"], input_ids=batch["input_ids"],
              document_ids=batch["document_ids"], position_ids=batch["position_ids"], ttt_steps=steps)
    finally:
        handle.remove()
    assert len(logits) == steps
    return logits


@torch.no_grad()
def _our_step_logits(drafter, samples, steps):
    batch = pack_samples(samples, 10**6)
    hiddens = ttt_hidden_states(drafter, batch.input_ids_BT, drafter.fuse_taps(batch.taps_BTLDt.float()),
                                batch.position_ids_BT, batch.doc_ids_BT, steps)
    return [drafter.logits(h) for h in hiddens], batch


def _samples(store, n):
    return [store.sample(i, as_torch=True) for i in range(n)]


def test_a_export_loads_with_no_missing_or_unexpected_keys(exported, theirs):
    from safetensors.torch import load_file

    saved = load_file(str(exported["export"] / "model.safetensors"))
    model_keys = set(theirs.state_dict())
    assert set(saved) - model_keys == set()                                      # unexpected
    assert model_keys - set(saved) == {"verifier_norm.weight", "verifier_lm_head.weight"}  # speculators fills these
    state = theirs.state_dict()
    for name, tensor in saved.items():
        assert state[name].dtype == tensor.dtype and torch.equal(state[name], tensor), name
    # what speculators filled itself comes from the verifier (the target), restricted to the draft vocabulary
    target = load_file(str(exported["target"] / "model.safetensors"))
    torch.testing.assert_close(theirs.verifier_norm.weight, target["model.norm.weight"], rtol=0, atol=0)
    torch.testing.assert_close(theirs.verifier_lm_head.weight, target["lm_head.weight"][theirs.t2d], rtol=0, atol=0)
    # d2t offsets and t2d describe the same draft vocabulary as ours
    d2t = exported["ours"].draft_to_target
    assert torch.equal(theirs.d2t + torch.arange(theirs.d2t.shape[0]), d2t)
    assert torch.equal(theirs.t2d.nonzero()[:, 0], d2t)


def test_b_first_step_logits_equal_ours(exported, theirs):
    _, _, shift_batch = _speculators()
    samples = _samples(exported["store"], 1)
    ours, _ = _our_step_logits(exported["ours"], samples, 1)
    mine = _their_step_logits(theirs, _their_batch(samples, shift_batch), 1)
    assert ours[0].shape == mine[0].shape and ours[0].shape[1] == samples[0].token_ids.shape[0] - 1
    assert float((ours[0] - mine[0]).abs().max()) <= TOL


def test_c_per_ttt_step_logits_equal_ours_on_a_packed_batch(exported, theirs):
    _, _, shift_batch = _speculators()
    samples = _samples(exported["store"], 3)
    ours, batch = _our_step_logits(exported["ours"], samples, TTT_STEPS)
    mine = _their_step_logits(theirs, _their_batch(samples, shift_batch), TTT_STEPS)
    assert int(batch.doc_ids_BT.max()) == 2  # three documents in one row
    for k in range(TTT_STEPS):
        valid = step_valid(batch.doc_ids_BT, k)[0]
        assert int(valid.sum()) > 10
        diff = (ours[k][0, valid] - mine[k][0, valid]).abs().max()
        assert float(diff) <= TOL, (k, float(diff))
        # speculators scores step k of slot p against the verifier's distribution at slot p + k, as we do
        # (its align_for_step): the chains are the same, not merely the logits


def test_d_tap_ids_resolve_to_ours(exported, theirs):
    taps = exported["ours"].config.tap_layers
    assert list(theirs.target_layer_ids) == taps.to_vllm() == list(TAPS)
    doc = json.loads((exported["export"] / "config.json").read_text())
    assert doc["speculators_config"]["verifier"]["name_or_path"] == str(exported["target"])

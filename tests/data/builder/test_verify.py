"""``osprey data verify --recompute``: passes on stores the builder made, fails (naming the samples) on
stores built with a wrong tap convention or wrong padding, works read-only on S3."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.builder import BuildConfig
from osprey_data.builder.backends import SequenceFeatures
from osprey_data.builder.backends import hf as hf_backend
from osprey_data.builder.runner import run as build
from osprey_data.builder.verify import VerifyConfig, pick_samples, run
from osprey_data.builder.verify_compare import BF16_REL, bars_for, compare_hidden, compare_topk
from osprey_data.errors import ConfigError, SampleNotFoundError
from osprey_data.store import StoreReader
from osprey_data.target_model import TapCapture
from tests.data.conftest import PROMPTS, write_jsonl
from tests.helpers.s3_server import use_identity
from tests.helpers.tiny_store import make_tiny_store

# 8 teacher-forced samples in batches of 4 (tiny_store's batch size), lengths 38..67 tokens.
N = 8


def _store(tmp_path_factory, name, model_dir, **kw):
    return make_tiny_store(tmp_path_factory.mktemp(name) / "store", model_dir, regenerate=False,
                           final_hidden=True, num_samples=N, **kw)


@pytest.fixture(scope="module")
def good_store(tmp_path_factory, tiny_llama_dir):
    return _store(tmp_path_factory, "good", tiny_llama_dir)


@pytest.fixture(scope="module")
def shifted_store(tmp_path_factory, tiny_llama_dir):
    """Taps captured one layer late (the SGLang-id-as-HF-id mistake): every sample is wrong."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(hf_backend, "TapCapture",
                  lambda model, taps, layers=None: TapCapture(model, [t + 1 for t in taps], layers=layers))
        return _store(tmp_path_factory, "shifted", tiny_llama_dir)


@pytest.fixture(scope="module")
def left_padded_store(tmp_path_factory, tiny_llama_dir):
    """Batched prefill with left padding and no attention mask over the pads: the shorter
    sequences of each batch attend to padding; the longest of each batch is unaffected."""
    features = hf_backend.HFBackend.features

    def left_padded(self, sequences, *, taps, topk, final_hidden):
        T = max(len(s) for s in sequences)
        padded = [np.concatenate([np.full(T - len(s), self.pad_id, dtype=np.int32), s]) for s in sequences]
        out = features(self, padded, taps=taps, topk=topk, final_hidden=final_hidden)  # pads count as tokens
        return [SequenceFeatures(hidden_TLD=f.hidden_TLD[T - len(s):], topk_ids_TK=f.topk_ids_TK[T - len(s):],
                                 topk_logprobs_TK=f.topk_logprobs_TK[T - len(s):],
                                 final_hidden_TD=f.final_hidden_TD[T - len(s):])
                for s, f in zip(sequences, out)]

    with pytest.MonkeyPatch.context() as m:
        m.setattr(hf_backend.HFBackend, "features", left_padded)
        return _store(tmp_path_factory, "left_padded", tiny_llama_dir)


def _invoke(*args):
    return CliRunner().invoke(cli, ["data", "verify", *map(str, args)], catch_exceptions=False)


def test_passes_on_a_store_the_builder_made(good_store):
    report = run(VerifyConfig(store=str(good_store), recompute=N))
    assert report.ok, report.format()
    assert [c.index for c in report.checks] == list(range(N))
    for c in report.checks:
        assert 0 < c.hidden_rel <= c.hidden_bar and c.final_rel <= c.final_bar
        assert c.top1_agree == 1.0 and c.topk_overlap == 1.0 and c.logprob_max_err < 1e-4
    res = _invoke(good_store, "--recompute", 3, "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert "PASS: 3 samples match" in res.output and res.output.count(" ok\n") == 3


def test_fails_on_taps_one_layer_off(shifted_store):
    res = _invoke(shifted_store, "--recompute", N, "--json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert not doc["ok"] and doc["failed"] == [f"tiny-{i:03d}" for i in range(N)]
    for s in doc["samples"]:
        assert s["failures"][0].startswith("hidden tap 1: rel err")  # every tap, the first named
        assert s["top1_agree"] == 1.0  # logits are untouched: only the taps are wrong
    text = _invoke(shifted_store, "--samples", "tiny-002,tiny-005").output
    assert "FAIL: 2 of 2 samples differ from the recomputation: tiny-002, tiny-005" in text
    assert "FAIL tiny-002 (index 2): hidden tap 1" in text


def test_fails_on_padding_that_the_mask_does_not_hide(left_padded_store):
    report = run(VerifyConfig(store=str(left_padded_store), recompute=N))
    assert not report.ok
    reader = StoreReader(str(left_padded_store))
    lengths = [reader.sample(i).num_tokens for i in range(N)]
    longest = {max(range(b, b + 4), key=lambda i: lengths[i]) for b in (0, 4)}
    assert {c.index for c in report.failed} == set(range(N)) - longest
    for c in report.failed:
        assert any(f.startswith("top-1 differs") for f in c.failures) and c.final_rel > c.final_bar
    assert report.format().splitlines()[-1].startswith(f"FAIL: {N - 2} of {N} samples differ")


def test_fp8_store_is_judged_by_the_fp8_bound(tmp_path_factory, tiny_llama_dir):
    store = make_tiny_store(tmp_path_factory.mktemp("fp8") / "store", tiny_llama_dir, regenerate=False,
                            num_samples=2, hidden_codec="fp8")
    report = run(VerifyConfig(store=str(store), recompute=2))
    assert report.ok, report.format()
    # fp8 keeps 3 mantissa bits: an error no bf16 store may have, inside fp8's own bound
    assert all(BF16_REL < c.hidden_rel <= c.hidden_bar < 2.0 ** -4 + 1e-3 for c in report.checks)


def test_sample_choice_is_seeded_and_ids_are_checked(good_store):
    reader = StoreReader(str(good_store))
    draw = pick_samples(reader, VerifyConfig(store=str(good_store), recompute=3, seed=7))
    assert draw == pick_samples(reader, VerifyConfig(store=str(good_store), recompute=3, seed=7))
    others = {tuple(pick_samples(reader, VerifyConfig(store=str(good_store), recompute=3, seed=s))) for s in range(8)}
    assert len(set(draw)) == 3 and len(others) > 1  # another seed, another draw
    assert pick_samples(reader, VerifyConfig(store=str(good_store), samples=("tiny-004", "tiny-001"))) == [4, 1]
    with pytest.raises(SampleNotFoundError, match="tiny-999"):
        run(VerifyConfig(store=str(good_store), samples=("tiny-999",)))
    res = CliRunner().invoke(cli, ["data", "verify", str(good_store), "--recompute", "0"])
    assert res.exit_code == 2 and "--recompute must be >= 1" in res.output


def test_another_target_is_refused(good_store, tiny_qwen3_dir, tmp_path):
    with pytest.raises(ConfigError, match="not the model this store was built from"):
        run(VerifyConfig(store=str(good_store), recompute=1, target=str(tiny_qwen3_dir)))
    res = _invoke(good_store, "--target", tmp_path / "missing")
    assert res.exit_code == 2 and "cannot load target" in res.output


def test_compare_functions_on_hand_made_arrays():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(5, 2, 64)).astype(np.float32)
    ref[:, :, 3] = 3e4  # a massive-activation channel: ignored by the relative error
    stored = ref.copy()
    stored[:, :, 3] += 100.0  # a large absolute error there stays out of rel err...
    h = compare_hidden(stored, ref, codec="bf16", dtype_rel=0.0)
    assert h["max_abs"] == pytest.approx(100.0, rel=1e-3) and (h["rel_L"] == 0).all()
    stored[:, 1, 10] += 1.0  # ...an ordinary channel's does not
    h = compare_hidden(stored, ref, codec="bf16", dtype_rel=0.0)
    assert h["rel_L"][0] == 0 and h["rel_L"][1] > h["bar_L"][1] == pytest.approx(BF16_REL, rel=1e-6)
    ids = np.array([[5, 6, 7], [1, 2, 3]], dtype=np.int32)
    lp = np.log(np.array([[0.5, 0.3, 0.1], [0.4, 0.399, 0.1]]))
    swapped = ids[:, [1, 0, 2]]
    k = compare_topk(swapped, lp, ids, lp, tie_gap=0.01)
    # position 1 is a near-tie (gap 0.0025): its swap is counted, not failed
    assert k["top1_agree"] == 0.0 and k["near_ties"] == 1 and k["clear_mismatch"] == 1
    assert k["overlap"] == 1.0 and k["lp_max"] > 0.5
    loose, tight = bars_for("bf16-blosc", "float32", "bfloat16"), bars_for("bf16", "float32", "float32")
    assert loose.logprob_mean > tight.logprob_mean and loose.tie_gap > tight.tie_gap


def test_reads_an_s3_store_with_read_only_credentials(s3_url, s3_endpoint, tiny_llama_dir, tmp_path, monkeypatch):
    inputs = write_jsonl(tmp_path / "in.jsonl", PROMPTS[:3])
    build(BuildConfig(target=str(tiny_llama_dir), inputs=(str(inputs),), out=s3_url, device="cpu", dtype="float32",
                      max_new_tokens=4, topk=8, batch_size=3, progress=False))
    use_identity(monkeypatch, s3_endpoint, "reader")  # s3:GetObject and s3:ListBucket only
    res = _invoke(s3_url, "--recompute", 2)  # the target named in the header
    assert res.exit_code == 0, res.output
    assert "PASS: 2 samples match" in res.output

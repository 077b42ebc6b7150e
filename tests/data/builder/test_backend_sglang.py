"""SGLang backend: import guards and option checks everywhere; the shared contract and a store
build in SGLang's engine (``-m sglang_cpu``, in the venv ``.ci/sglang_venv.sh`` makes).

The contract runs at SGLang's precision, bf16 (its CPU kernels have no float32), against the HF
backend in bf16: greedy ids equal up to the first near-tie (a top-2 gap under verify's bf16 tie
gap in the float32 reference's log-probs), features within ``osprey data verify``'s bf16 bars.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from osprey_data.builder.backends import HFBackend
from osprey_data.builder.backends.sglang import SGLangBackend, sglang_available
from osprey_data.builder.config import BuildConfig
from osprey_data.builder.verify import VerifyConfig
from osprey_data.builder.verify import run as verify
from osprey_data.builder.verify_compare import DTYPE_HIDDEN_REL, DTYPE_TIE_GAP, bars_for, compare_hidden, compare_topk
from osprey_data.errors import BackendUnavailableError, ConfigError
from osprey_data.store import StoreReader
from tests.data.builder.backend_contract import (PROMPTS, BackendContract, assert_same_greedy_ids_up_to_near_ties,
                                                 reference_model)
from tests.helpers.tiny import make_tiny_llama

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TIE_GAP = DTYPE_TIE_GAP["bfloat16"]


def _config(model_dir, **kw):
    return BuildConfig(**{"target": str(model_dir), "inputs": ("x",), "out": "o", "backend": "sglang", **kw})


def test_package_import_never_imports_sglang():
    import osprey_cli.build_cmd  # noqa: F401
    import osprey_data.builder.backends  # noqa: F401
    import osprey_data.builder.runner  # noqa: F401

    # where SGLang is installed it must still not be imported until the backend is constructed
    assert "sglang" not in sys.modules


def test_cpu_refuses_float32_before_loading(tiny_llama_dir):
    for dtype in ("float32", "float16"):
        with pytest.raises(ConfigError, match="bfloat16 only"):
            SGLangBackend(_config(tiny_llama_dir, device="cpu", dtype=dtype))
    with pytest.raises(ConfigError, match="'mps' is not a device"):   # refused by BuildConfig itself, earlier
        SGLangBackend(_config(tiny_llama_dir, device="mps"))


@pytest.mark.skipif(sglang_available("cpu"), reason="checks the error raised when SGLang is missing")
def test_missing_sglang_is_a_clear_error(tiny_llama_dir):
    with pytest.raises(BackendUnavailableError, match="sglang"):
        SGLangBackend(_config(tiny_llama_dir, device="cpu"))


@pytest.fixture(scope="module")
def sgl_llama_dir(tmp_path_factory, tiny_tokenizer):
    # SGLang's CPU attention kernels refuse head size 16 (the tiny default): 4 heads of 64.
    return make_tiny_llama(tmp_path_factory.mktemp("sgl_llama"), tiny_tokenizer, hidden_size=256)


@pytest.fixture(scope="module")
def backend(sgl_llama_dir):
    be = SGLangBackend(_config(sgl_llama_dir, device=DEVICE, dtype="bfloat16"))
    yield be
    be.close()


@pytest.fixture(scope="module")
def hf_bf16(sgl_llama_dir):
    return HFBackend(BuildConfig(target=str(sgl_llama_dir), inputs=("x",), out="o", device=DEVICE, dtype="bfloat16"))


def _ids(backend, text):
    return backend.tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.sglang_cpu
class TestSGLangContract(BackendContract):
    def test_identity(self, backend):
        super().test_identity(backend)
        assert backend.identity.dtype == "bfloat16"

    def test_features_match_output_hidden_states(self, backend):
        """Against a float32 reference, within verify's bf16 bars (not float32's tolerances)."""
        ref = reference_model(backend)
        L = backend.num_layers
        taps = (1, L // 2, L - 1)
        seqs = [np.asarray(_ids(backend, p), dtype=np.int32) for p in PROMPTS]
        bars = bars_for("bf16", "bfloat16", "float32")
        for seq, f in zip(seqs, backend.features(seqs, taps=taps, topk=5, final_hidden=True)):
            with torch.no_grad():
                out = ref(input_ids=torch.tensor(seq[None], dtype=torch.long), output_hidden_states=True)
            want_TLD = torch.stack([out.hidden_states[i][0] for i in taps], dim=1).numpy()
            h = compare_hidden(f.hidden_TLD.float().numpy(), want_TLD, codec="bf16",
                               dtype_rel=DTYPE_HIDDEN_REL["bfloat16"])
            assert (h["rel_L"] <= h["bar_L"]).all(), h
            lp_TK, ids_TK = torch.log_softmax(out.logits[0].float(), dim=-1).topk(5, dim=-1)
            k = compare_topk(f.topk_ids_TK, f.topk_logprobs_TK, ids_TK.numpy(), lp_TK.numpy(), tie_gap=bars.tie_gap)
            assert k["clear_mismatch"] == 0 and k["clear_missing"] == 0 and k["lp_mean"] <= bars.logprob_mean, k

    def test_greedy_generation_matches_naive_decoding(self, backend, hf_bf16):
        """Same ids as the HF backend at the same precision, up to the first near-tie."""
        assert_same_greedy_ids_up_to_near_ties(backend, hf_bf16, [_ids(backend, p) for p in PROMPTS], tie_gap=TIE_GAP)

    @pytest.mark.xfail(strict=True, reason="measured on SGLang's CPU engine (jul20 snapshot): the same requests with "
                       "the same sampling_seed sample different tokens on a rerun; stores built with "
                       "--temperature > 0 are not reproducible there (greedy is)")
    def test_sampling_is_seeded_per_request(self, backend):
        super().test_sampling_is_seeded_per_request(backend)


@pytest.mark.sglang_cpu
def test_store_built_with_sglang_matches_hf_and_passes_verify(backend, sgl_llama_dir, tmp_path):
    """A whole build: loss masks equal the HF backend's (same precision) wherever the token ids
    are equal, and ``osprey data verify --recompute`` passes on the SGLang store."""
    from osprey_data.builder.runner import run as build
    from tests.data.conftest import PROMPTS as RECORDS
    from tests.data.conftest import write_jsonl

    inputs = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    kw = dict(target=str(sgl_llama_dir), inputs=(str(inputs),), device=DEVICE, dtype="bfloat16", max_new_tokens=8,
              topk=8, batch_size=4, progress=False)
    backend.close()  # one engine at a time on a small machine
    build(BuildConfig(out=str(tmp_path / "sgl"), backend="sglang", **kw))
    build(BuildConfig(out=str(tmp_path / "hf"), backend="hf", **kw))
    sgl, hf = StoreReader(str(tmp_path / "sgl")), StoreReader(str(tmp_path / "hf"))
    assert sgl.num_samples == hf.num_samples == len(RECORDS)
    assert sgl.header.build_config["dtype"] == "bfloat16" and sgl.header.build_config["backend"] == "sglang"
    same = 0
    for i in range(sgl.num_samples):
        a, b = sgl.sample(i), hf.sample(i)
        if np.array_equal(a.token_ids, b.token_ids):
            same += 1
            np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
            np.testing.assert_array_equal(a.hidden_TLD, b.hidden_TLD)  # the same prefill
    assert same >= 1
    report = verify(VerifyConfig(store=str(tmp_path / "sgl"), recompute=len(RECORDS)))
    assert report.ok, report.format()

"""SGLang backend: the shared contract where SGLang and CUDA exist; import guards everywhere."""

from __future__ import annotations

import sys

import pytest

from osprey_data.builder.backends.sglang import SGLangBackend, sglang_available
from osprey_data.builder.config import BuildConfig
from osprey_data.errors import BackendUnavailableError
from tests.data.builder.backend_contract import BackendContract


def test_package_import_never_imports_sglang():
    import osprey_cli.build_cmd  # noqa: F401
    import osprey_data.builder.backends  # noqa: F401
    import osprey_data.builder.runner  # noqa: F401

    # where SGLang is installed it must still not be imported until the backend is constructed
    assert "sglang" not in sys.modules


@pytest.mark.skipif(sglang_available(), reason="checks the error raised when SGLang/CUDA are missing")
def test_missing_sglang_is_a_clear_error(tiny_llama_dir):
    with pytest.raises(BackendUnavailableError, match="sglang"):
        SGLangBackend(BuildConfig(target=str(tiny_llama_dir), inputs=("x",), out="o", backend="sglang"))


@pytest.fixture(scope="module")
def backend(tiny_llama_dir):
    if not sglang_available():
        pytest.skip("needs the sglang extra and CUDA")
    be = SGLangBackend(BuildConfig(target=str(tiny_llama_dir), inputs=("x",), out="o", backend="sglang",
                                   device="cuda", dtype="float32"))
    yield be
    be.close()


@pytest.mark.gpu
@pytest.mark.sglang
class TestSGLangContract(BackendContract):
    hidden_atol = 1e-3
    logprob_atol = 1e-3

    def test_sampling_is_seeded_per_request(self, backend):
        # SGLang's sampler seeds per request via sampling_seed; batch-independence is its contract
        super().test_sampling_is_seeded_per_request(backend)

"""The HF backend's shared contract on CUDA (float32): generation, taps and top-k on a GPU equal the
CPU float32 references within the tolerance the SGLang backend is held to."""

from __future__ import annotations

import pytest
import torch

from osprey_data.builder.backends import HFBackend
from osprey_data.builder.config import BuildConfig
from tests.data.builder.backend_contract import BackendContract


@pytest.fixture(scope="module")
def backend(tiny_llama_dir):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return HFBackend(BuildConfig(target=str(tiny_llama_dir), inputs=("unused",), out="unused", device="cuda",
                                 dtype="float32"))


@pytest.mark.gpu
class TestHFContractOnCUDA(BackendContract):
    hidden_atol = 1e-3
    logprob_atol = 1e-3

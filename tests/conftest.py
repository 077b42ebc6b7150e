"""Shared fixtures: tiny local tokenizers and random models, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.tiny import make_tiny_llama, make_tiny_qwen3, make_tiny_tokenizer

# precision "auto" must mean the same on every CI machine: float32, as on a CPU without bf16
# matrix units (set before anything runs, so that subprocesses inherit it; tests of the bf16
# paths name their precision or mock the detection; OSPREY_CPU_BF16=1 runs the suite the other way)
os.environ.setdefault("OSPREY_CPU_BF16", "0")

# Tests must never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# Tests write only under their tmp paths. The one default folder they could reach unasked is the
# shard cache of remote stores ($OSPREY_STORE_CACHE, default $OSPREY_CACHE/stores): a test that
# reads an s3:// store without naming a cache (or whose monkeypatch.undo() dropped the one its
# fixture named) wrote ~500 KB there on every run. $OSPREY_CACHE itself stays the user's: the
# engine and demo tests read the real SmolLM2 from it. The session points the store cache at a
# folder of its own and fails at the end if anything landed there or in the user's folder.
_STORE_CACHE_KEY = pytest.StashKey[tuple]()


def _user_store_cache() -> Path:
    named = os.environ.get("OSPREY_STORE_CACHE", "").strip()
    if named and named.lower() not in ("off", "0", "none", "false"):
        return Path(named).expanduser()
    base = os.environ.get("OSPREY_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "osprey") / "stores"


def _entries(folder: Path) -> set[str]:
    return set(os.listdir(folder)) if folder.is_dir() else set()


@pytest.hookimpl(trylast=True)  # after the tmpdir plugin has made config._tmp_path_factory
def pytest_configure(config):
    user = _user_store_cache()
    fallback = Path(config._tmp_path_factory.mktemp("unnamed-store-cache", numbered=True))
    config.stash[_STORE_CACHE_KEY] = (user, _entries(user), fallback)
    os.environ["OSPREY_STORE_CACHE"] = str(fallback)  # subprocesses inherit it


def pytest_sessionfinish(session, exitstatus):
    user, before, fallback = session.config.stash[_STORE_CACHE_KEY]
    found = [f"{user}/{name}" for name in sorted(_entries(user) - before)]
    found += [f"{fallback}/{name} (a test read a remote store without naming its cache under tmp_path)"
              for name in sorted(_entries(fallback))]
    if found:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line("the tests wrote into the default store cache: " + "; ".join(found), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a core dependency
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
    # Interop tests need the speculators package, which lives in its own environment (its pins
    # differ from ours): they run only when the -m expression names them (`pytest -m interop`),
    # and there they fail rather than skip when the package is missing.
    # The same for the SGLang engine tests (its venv: .ci/sglang_venv.sh): `pytest -m sglang_cpu`,
    # and the vLLM ones (its venv: engines/setup_vllm.sh): `pytest -m engine`.
    for marker in ("interop", "sglang_cpu", "engine"):
        if marker not in (config.getoption("markexpr") or ""):
            chosen = [item for item in items if marker in item.keywords]
            if chosen:
                config.hook.pytest_deselected(items=chosen)
                items[:] = [item for item in items if marker not in item.keywords]


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """Folder with a trained byte-level BPE tokenizer (ChatML template)."""
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    make_tiny_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer):
    """Folder with a random 6-layer Llama (d=64) sharing the tiny tokenizer."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, tiny_tokenizer):
    """Folder with a random 6-layer Qwen3 (q/k norms, tied embeddings)."""
    return make_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"), tiny_tokenizer)


@pytest.fixture(scope="session")
def s3_endpoint():
    """A local S3 endpoint over HTTP (moto server) with a bucket, a writer and a reader user."""
    from tests.helpers.s3_server import start_s3_endpoint

    endpoint = start_s3_endpoint()
    yield endpoint
    endpoint.stop()


@pytest.fixture()
def s3_url(s3_endpoint, monkeypatch, tmp_path, request):
    """A fresh ``s3://`` store URL; this process talks to the endpoint as the writer, with its
    credentials in the environment only, and caches remote shards under ``tmp_path``."""
    import re
    import uuid

    from tests.helpers.s3_server import use_identity

    use_identity(monkeypatch, s3_endpoint, "writer")
    monkeypatch.setenv("OSPREY_STORE_CACHE", str(tmp_path / "store-cache"))
    name = re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)[:40]
    return f"s3://{s3_endpoint.bucket}/{name}-{uuid.uuid4().hex[:8]}/store"


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Every test model is tiny: one thread is faster than two spin-waiting OpenMP threads on a
    shared 2-core machine (measured ~5x on the TTT and speculative-decoding tests)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""``--backend vllm`` without vLLM: the driver's pure mapping (ranks, stop tokens, file cleanup),
the option checks made before any engine starts, and the one-line errors of a missing or broken
vLLM venv. The engine itself runs in ``test_backend_vllm.py`` (``-m engine``)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass

import pytest

from osprey_data.builder.backends.vllm import VLLMBackend, engine_env, find_vllm_python, log_cause
from osprey_data.builder.backends.vllm_rig.driver import cleanup_capture, completion_result, topk_row
from osprey_data.builder.config import BuildConfig
from osprey_data.errors import BackendUnavailableError, ConfigError
from tests.helpers.venvs import venv_over_ours


@dataclass
class _Logprob:  # the two fields of vllm.logprobs.Logprob the driver reads
    logprob: float
    rank: int | None


def _config(model_dir, **kw):
    return BuildConfig(**{"target": str(model_dir), "inputs": ("x",), "out": "o", "backend": "vllm",
                          "device": "cpu", **kw})


def test_package_import_never_imports_vllm():
    import osprey_cli.build_cmd  # noqa: F401
    import osprey_data.builder.backends  # noqa: F401
    import osprey_data.builder.runner  # noqa: F401

    assert "vllm" not in sys.modules


def test_topk_row_sorts_by_rank_and_drops_the_actual_token_outside_topk():
    # vLLM's dict order is not rank order; the actual token (id 7) sits at rank 40 outside top-3
    entries = {5: _Logprob(-2.0, 3), 7: _Logprob(-9.0, 40), 1: _Logprob(-0.5, 1), 9: _Logprob(-1.0, 2)}
    assert topk_row(entries, 3, "p") == ([1, 9, 5], [-0.5, -1.0, -2.0])
    # the actual token inside the top-k appears once, with k entries in all
    assert topk_row({4: _Logprob(-0.1, 1), 2: _Logprob(-3.0, 2)}, 2, "p") == ([4, 2], [-0.1, -3.0])


def test_topk_row_drops_the_actual_token_tied_with_the_kth():
    # id 7 is the actual token, outside vLLM's top-3 but tied with the 3rd: vLLM counts it rank 3
    entries = {1: _Logprob(-0.5, 1), 9: _Logprob(-1.0, 2), 5: _Logprob(-2.0, 3), 7: _Logprob(-2.0, 3)}
    assert topk_row(entries, 3, "p", actual=7) == ([1, 9, 5], [-0.5, -1.0, -2.0])
    with pytest.raises(RuntimeError, match="ranks \\[1, 2, 3, 3\\]"):  # not knowing the actual token
        topk_row(entries, 3, "p")


def test_topk_row_refuses_missing_ranks():
    with pytest.raises(RuntimeError, match="sequence 0 position 4: vLLM returned ranks \\[1, 3\\]"):
        topk_row({1: _Logprob(-0.1, 1), 2: _Logprob(-2.0, 3)}, 3, "sequence 0 position 4")


def test_completion_result_separates_the_stop_token():
    stops = {2, 7}
    assert completion_result([5, 6, 2], "stop", None, stops) == \
        {"token_ids": [5, 6], "finish_reason": "stop", "stop_token_id": 2}
    assert completion_result([5, 6], "stop", 7, stops) == \
        {"token_ids": [5, 6], "finish_reason": "stop", "stop_token_id": 7}
    assert completion_result([5, 6, 2], "length", None, stops) == \
        {"token_ids": [5, 6, 2], "finish_reason": "length", "stop_token_id": None}
    with pytest.raises(RuntimeError, match="finish_reason='abort'"):
        completion_result([5], "abort", None, stops)
    with pytest.raises(RuntimeError, match="none of the stop ids"):
        completion_result([5], "stop", "</s>", stops)


def test_cleanup_capture_removes_file_and_lock(tmp_path):
    path = tmp_path / "req-1.safetensors"
    path.write_bytes(b"x")
    (tmp_path / "req-1.safetensors.lock").write_bytes(b"")
    cleanup_capture(str(path))
    assert list(tmp_path.iterdir()) == []
    cleanup_capture(str(path))  # already gone: nothing to do
    cleanup_capture(None)


def test_options_vllm_cannot_serve_are_refused_before_starting(tiny_llama_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("OSPREY_VLLM_VENV", str(tmp_path / "nowhere"))  # never reached
    with pytest.raises(ConfigError, match="--final-hidden"):
        VLLMBackend(_config(tiny_llama_dir, final_hidden=True))
    with pytest.raises(ConfigError, match="no bf16-autocast"):
        VLLMBackend(_config(tiny_llama_dir, dtype="bf16-autocast"))
    with pytest.raises(ConfigError, match="no float16"):
        VLLMBackend(_config(tiny_llama_dir, dtype="float16"))
    with pytest.raises(ConfigError, match="GGUF"):
        VLLMBackend(_config(tiny_llama_dir, gguf_file="model.gguf"))
    with pytest.raises(ConfigError, match="greedily only"):  # vLLM's capture path samples wrongly
        VLLMBackend(_config(tiny_llama_dir, temperature=0.7))
    with pytest.raises(BackendUnavailableError, match="no-venv|nowhere"):  # teacher-forced: temperature unused
        VLLMBackend(_config(tiny_llama_dir, temperature=0.7, regenerate=False))


def test_missing_venv_is_one_line_naming_the_setup_script(tiny_llama_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("OSPREY_VLLM_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(BackendUnavailableError, match="engines/setup_vllm.sh") as err:
        VLLMBackend(_config(tiny_llama_dir))
    assert "\n" not in str(err.value) and str(tmp_path / "no-venv") in str(err.value)
    with pytest.raises(BackendUnavailableError):
        find_vllm_python(tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="needs an interpreter without vLLM")
def test_venv_without_vllm_fails_at_start_with_the_driver_error(tiny_llama_dir, monkeypatch, tmp_path):
    """The real driver process in an interpreter lacking vLLM: its first answer is the import
    error, which the backend raises as one line naming the kept engine log."""
    # A real venv with our packages (torch, ...) but no vLLM: a bare link to sys.executable would
    # start the base interpreter, which may lack torch, and the error would name torch instead.
    venv = tmp_path / "venv"
    venv_over_ours(venv)
    monkeypatch.setenv("OSPREY_VLLM_VENV", str(venv))
    with pytest.raises(BackendUnavailableError, match="No module named 'vllm'") as err:
        VLLMBackend(_config(tiny_llama_dir, dtype="float32"))
    msg = str(err.value)
    assert "\n" not in msg and "the whole log: " in msg
    log = msg.rsplit("the whole log: ", 1)[1].rstrip(")")
    assert "ModuleNotFoundError" in open(log, encoding="utf-8").read()
    shutil.rmtree(os.path.dirname(log))  # kept for the user on failure; this test's own is done


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="needs an interpreter without vLLM")
def test_a_venv_without_vllm_is_refused_before_the_target_loads(tiny_llama_dir, monkeypatch, tmp_path):
    """Issue #45 item 11: the pre-check only looked for bin/python, so a venv lacking vLLM passed
    and the build failed at engine start, after loading the target. It now imports vLLM there."""
    import json

    from osprey_data.builder.backends import vllm as vllm_backend
    from osprey_data.builder.runner import run as build

    venv = tmp_path / "venv"
    venv_over_ours(venv)
    monkeypatch.setenv("OSPREY_VLLM_VENV", str(venv))
    with pytest.raises(BackendUnavailableError, match=rf"`import vllm` fails in the venv {venv} \(ModuleNotFound"
                                                      r"Error: No module named 'vllm'\); install vLLM there"):
        vllm_backend.check_vllm_venv()
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps({"id": "a", "conversations": [{"role": "user", "content": "hi"}]}) + "\n")
    monkeypatch.setattr(vllm_backend, "_load_meta_identity", lambda *a: pytest.fail("the target must not load"))
    with pytest.raises(BackendUnavailableError, match="No module named 'vllm'"):
        build(BuildConfig(target=str(tiny_llama_dir), inputs=(str(inputs),), out=str(tmp_path / "store"),
                          backend="vllm", device="cpu", dtype="float32", progress=False))
    assert not (tmp_path / "store").exists()


def test_engine_env_and_log_cause(tmp_path):
    py = tmp_path / "venv" / "bin" / "python"
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "libiomp5.so").write_bytes(b"")
    env = engine_env(py, 2)
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["LD_PRELOAD"].endswith("libiomp5.so") and "CUDA_VISIBLE_DEVICES" not in env
    assert engine_env(py, 1, "cuda:3")["CUDA_VISIBLE_DEVICES"] == "3"
    log = tmp_path / "engine.log"
    log.write_text("INFO start\n[rank0]: ValueError: bad block size\nINFO shutting down\n", encoding="utf-8")
    assert log_cause(log) == "ValueError: bad block size"

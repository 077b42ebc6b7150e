"""Atomic files and folders: old or new, never a mix; never delete-then-rename; umask respected."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from osprey_data import atomic
from osprey_data.atomic import apply_umask, atomic_dir, atomic_file, replace_dir, write_bytes, write_json
from osprey_data.errors import ConfigError


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_files_are_replaced_whole_and_get_the_umask_modes(tmp_path, umask_022):
    path = write_bytes(tmp_path / "sub" / "a.bin", b"one")
    write_json(tmp_path / "sub" / "a.json", {"x": 1})
    assert path.read_bytes() == b"one" and (tmp_path / "sub" / "a.json").read_text() == '{\n  "x": 1\n}\n'
    assert _mode(path) == 0o644 and _leftovers(tmp_path / "sub") == []
    with pytest.raises(RuntimeError):
        with atomic_file(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer died")
    assert path.read_bytes() == b"one" and _leftovers(tmp_path / "sub") == []
    with atomic_file(tmp_path / "w.safetensors") as tmp:   # safetensors itself creates 0600 files
        assert tmp.suffix == ".safetensors"
        save_file({"a": torch.zeros(2)}, str(tmp))
    assert _mode(tmp_path / "w.safetensors") == 0o644


def test_folders_replace_safely_and_get_the_umask_modes(tmp_path, umask_022):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        save_file({"a": torch.zeros(2)}, str(tmp / "model.safetensors"))
        (tmp / "sub").mkdir(mode=0o700)
    assert _mode(out) == 0o755 and _mode(out / "sub") == 0o755 and _mode(out / "model.safetensors") == 0o644
    with pytest.raises(ConfigError, match="exists"):
        with atomic_dir(out):
            pass
    with pytest.raises(RuntimeError):
        with atomic_dir(out, overwrite=True) as tmp:
            (tmp / "partial").write_text("x")
            raise RuntimeError("writer died")
    assert (out / "model.safetensors").is_file() and not (out / "partial").exists()
    assert _leftovers(tmp_path) == []
    with atomic_dir(out, overwrite=True) as tmp:
        (tmp / "new").write_text("y")
    assert sorted(p.name for p in out.iterdir()) == ["new"] and _leftovers(tmp_path) == []


def test_replace_dir_puts_the_old_folder_back_when_the_move_fails(tmp_path, monkeypatch):
    old, new = tmp_path / "final", tmp_path / ".final.tmp"
    old.mkdir()
    (old / "weights").write_text("old")
    new.mkdir()
    real_rename = os.rename
    calls = []

    def flaky_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:   # the old folder is aside; the new one fails to move in
            raise OSError("disk gone")
        real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", flaky_rename)
    with pytest.raises(OSError, match="disk gone"):
        replace_dir(new, old)
    assert (old / "weights").read_text() == "old"   # never deleted before the new one was in place


def test_apply_umask_keeps_execute_bits(tmp_path, umask_022):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    os.chmod(script, 0o700)
    apply_umask(script)
    assert _mode(script) == 0o755

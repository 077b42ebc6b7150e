"""Issue #45 item 12 (M05b): resuming a build with the same local target folder spelled otherwise
(``./work/../work/llama``, its absolute path) continues the store, which keeps its own spelling; another
folder is still refused."""

from __future__ import annotations

import os
import shutil

import pytest

from osprey_data.errors import ManifestMismatchError
from osprey_data.store import StoreReader
from tests.helpers.tiny_store import make_tiny_store


def test_the_same_target_folder_spelled_otherwise_resumes(tmp_path, tiny_llama_dir, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(tiny_llama_dir, work / "llama")
    monkeypatch.chdir(tmp_path)
    make_tiny_store("store", "work/llama", num_samples=2, max_new_tokens=4)
    for spelling in ("./work/../work/llama", str(work / "llama")):
        make_tiny_store("store", spelling, num_samples=3, max_new_tokens=4)
    reader = StoreReader("store")
    assert len(reader) == 3 and reader.header.target.name_or_path == "work/llama"
    shutil.copytree(work / "llama", work / "other")   # the same weights in another folder: another target
    with pytest.raises(ManifestMismatchError, match=r"the target differs in name_or_path \(store: 'work/llama', "
                                                    r"this run: 'work/other'\)"):
        make_tiny_store("store", "work/other", num_samples=3, max_new_tokens=4)
    assert os.path.isdir("store")

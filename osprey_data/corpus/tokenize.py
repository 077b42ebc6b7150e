"""Tokenize a text corpus into uint32 token shards for Stage 2 pretraining (resumable).

Output folder::

    shard-00000.bin ...   raw little-endian uint32 token ids; each document followed by EOS
    index.json            tokenizer identity, inputs, shards (+ sha256), counts
                          (schemas/corpus-index.v1.json) -- written LAST: no index = not done
    progress.json         only while unfinished: shards done so far and where to continue

Shards hold whole documents and close once they reach ``shard_tokens``; each is written under
a temporary name and renamed, then ``progress.json`` is atomically updated. Restarting the same
command skips completed shards (their documents are read but not re-tokenized) and continues;
restarting with different inputs, tokenizer or settings is refused. Text is tokenized without
special tokens (no BOS); the EOS id separates documents.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from osprey_data.atomic import write_bytes, write_json
from osprey_data.corpus.sources import TXT_DOC_MODES, detect_format, iter_documents
from osprey_data.errors import ConfigError, InputError
from osprey_data.schema_check import validate

__all__ = ["TokenizeCorpusConfig", "run", "tokenizer_identity", "load_tokenizer", "INDEX_NAME", "INDEX_SCHEMA"]

INDEX_NAME = "index.json"
PROGRESS_NAME = "progress.json"
INDEX_SCHEMA = "corpus-index.v1.json"


@dataclass(kw_only=True)
class TokenizeCorpusConfig:
    """What to tokenize, with which tokenizer, into which folder."""

    tokenizer: str
    """Tokenizer folder (or model folder with a tokenizer) or hub id when online."""
    inputs: list[Path]
    """Text (.txt), JSONL (.jsonl), Parquet (.parquet) files or `datasets` save_to_disk folders."""
    out_dir: Path
    """Output folder for shards and index.json (created; a finished one is left as is)."""
    text_field: str = "text"
    """Field (JSONL) or column (Parquet, datasets) holding the document text."""
    txt_docs: str = "file"
    """How .txt files split into documents: ``file`` (one each), ``paragraph`` (blank lines), ``line``."""
    shard_tokens: int = 1 << 24
    """Close a shard once it holds at least this many tokens (64 MiB of uint32 by default)."""
    batch_docs: int = 256
    """Documents tokenized per call (batched fast-tokenizer calls)."""
    progress: bool = True
    """Show a tqdm bar (documents tokenized, current file, tokens)."""

    def __post_init__(self) -> None:
        self.inputs = [Path(p) for p in self.inputs]
        self.out_dir = Path(self.out_dir)
        if not self.inputs:
            raise ConfigError("no --input given; pass at least one corpus file or folder")
        if self.txt_docs not in TXT_DOC_MODES:
            raise ConfigError(f"txt_docs must be one of {TXT_DOC_MODES}, got {self.txt_docs!r}")
        if self.shard_tokens < 1 or self.batch_docs < 1:
            raise ConfigError("shard_tokens and batch_docs must be >= 1")
        if not self.text_field:
            raise ConfigError("text_field must not be empty")


def load_tokenizer(name_or_path: str):
    """AutoTokenizer with a readable error for a missing/invalid folder."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except Exception as exc:  # transformers raises OSError/ValueError/... depending on what is missing
        raise InputError(f"{name_or_path}: cannot load a tokenizer ({type(exc).__name__}: {exc}); pass a folder "
                         "with tokenizer.json/tokenizer_config.json") from None


def tokenizer_identity(tokenizer: Any, name_or_path: str) -> dict[str, Any]:
    """Name, class, content hash, vocab size and EOS of ``tokenizer`` (stable across loads)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        payload = json.loads(backend.to_str())
        # padding/truncation are call-time settings, not part of the vocabulary's identity
        payload.pop("padding", None)
        payload.pop("truncation", None)
        body = json.dumps(payload, sort_keys=True)
    else:
        body = json.dumps(sorted(tokenizer.get_vocab().items()))
    body += json.dumps(sorted(str(t) for t in tokenizer.all_special_tokens))
    if tokenizer.eos_token_id is None:
        raise InputError(f"{name_or_path}: the tokenizer has no EOS token, needed to separate documents; "
                         "set eos_token in its tokenizer_config.json")
    return {"name_or_path": str(name_or_path), "class": type(tokenizer).__name__,
            "hash": hashlib.sha256(body.encode("utf-8")).hexdigest(), "vocab_size": len(tokenizer),
            "eos_token_id": int(tokenizer.eos_token_id), "eos_token": str(tokenizer.eos_token)}


def _input_entry(path: Path) -> dict[str, Any]:
    fmt = detect_format(path)    # also: a clear error for a missing path
    stat_path = path
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    return {"path": str(path.resolve()), "format": fmt, "size_bytes": int(size),
            "mtime_ns": int(stat_path.stat().st_mtime_ns), "documents": 0, "tokens": 0}


@dataclass
class _State:
    """Resume state: finished shards and the first document not yet in one."""

    shards: list[dict[str, Any]] = field(default_factory=list)
    next_input: int = 0
    next_doc: int = 0          # index (0-based, in reader order) of the next document of next_input
    inputs: list[dict[str, Any]] = field(default_factory=list)
    skipped_empty: int = 0


class _ShardWriter:
    def __init__(self, cfg: TokenizeCorpusConfig, state: _State, identity_doc: dict[str, Any]) -> None:
        self.cfg, self.state, self.identity_doc = cfg, state, identity_doc
        self.buffer: list[np.ndarray] = []
        self.tokens = 0
        self.docs = 0
        self.empty = 0    # empty documents seen since the last close (committed with the shard)

    def skip_empty(self) -> None:
        self.empty += 1

    def add(self, ids: np.ndarray, input_idx: int, doc_idx: int) -> None:
        self.buffer.append(ids)
        self.tokens += len(ids)
        self.docs += 1
        entry = self.state.inputs[input_idx]
        entry["documents"] += 1
        entry["tokens"] += int(len(ids))
        if self.tokens >= self.cfg.shard_tokens:
            self.close(input_idx, doc_idx + 1)

    def close(self, next_input: int, next_doc: int) -> None:
        if self.tokens:
            name = f"shard-{len(self.state.shards):05d}.bin"
            data = np.concatenate(self.buffer).astype("<u4", copy=False)
            write_bytes(self.cfg.out_dir / name, data.tobytes())
            self.state.shards.append({"file": name, "tokens": int(self.tokens), "documents": int(self.docs),
                                      "sha256": hashlib.sha256(data.tobytes()).hexdigest()})
        self.state.next_input, self.state.next_doc = next_input, next_doc
        self.state.skipped_empty += self.empty
        self.buffer, self.tokens, self.docs, self.empty = [], 0, 0, 0
        write_json(self.cfg.out_dir / PROGRESS_NAME, {
            "identity": self.identity_doc, "shards": self.state.shards, "next_input": next_input,
            "next_doc": next_doc, "inputs": self.state.inputs, "skipped_empty": self.state.skipped_empty})


def _load_state(cfg: TokenizeCorpusConfig, identity_doc: dict[str, Any], inputs: list[dict[str, Any]]) -> _State:
    progress = cfg.out_dir / PROGRESS_NAME
    if not progress.is_file():
        for stale in _shard_files(cfg.out_dir):
            stale.unlink()      # shards without a progress record are orphans of a crash
        return _State(inputs=inputs)
    doc = json.loads(progress.read_text(encoding="utf-8"))
    if doc.get("identity") != identity_doc:
        raise ConfigError(f"{cfg.out_dir}: holds an unfinished tokenization with other inputs, tokenizer or "
                          "settings; use another --out or delete this folder")
    state = _State(shards=doc["shards"], next_input=doc["next_input"], next_doc=doc["next_doc"],
                   inputs=doc["inputs"], skipped_empty=doc["skipped_empty"])
    keep = {s["file"] for s in state.shards}
    for s in state.shards:
        if (cfg.out_dir / s["file"]).stat().st_size != 4 * s["tokens"]:
            raise InputError(f"{cfg.out_dir / s['file']}: size does not match progress.json; delete {cfg.out_dir} "
                             "and tokenize again")
    for stale in _shard_files(cfg.out_dir):
        if stale.name not in keep:
            stale.unlink()
    return state


def _shard_files(out_dir: Path) -> list[Path]:
    """Token shards and the temporary files of interrupted shard writes."""
    return [*out_dir.glob("shard-*.bin"), *out_dir.glob(".shard-*.bin.tmp-*")]


def run(cfg: TokenizeCorpusConfig) -> dict[str, Any]:
    """Tokenize ``cfg.inputs`` into ``cfg.out_dir``; returns the (validated) index document."""
    tokenizer = load_tokenizer(cfg.tokenizer)
    ident = tokenizer_identity(tokenizer, cfg.tokenizer)
    inputs = [_input_entry(p) for p in cfg.inputs]
    identity_doc = {"tokenizer_hash": ident["hash"], "text_field": cfg.text_field, "txt_docs": cfg.txt_docs,
                    "shard_tokens": cfg.shard_tokens,
                    "inputs": [{k: e[k] for k in ("path", "size_bytes", "mtime_ns")} for e in inputs]}
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    index_path = cfg.out_dir / INDEX_NAME
    if index_path.is_file():
        index = json.loads(index_path.read_text(encoding="utf-8"))
        if index.get("identity") == identity_doc:
            return index          # already complete: nothing to do
        raise ConfigError(f"{cfg.out_dir}: already holds a finished corpus of other inputs or tokenizer; "
                          "use another --out")
    state = _load_state(cfg, identity_doc, inputs)
    writer = _ShardWriter(cfg, state, identity_doc)
    eos = np.array([ident["eos_token_id"]], dtype=np.uint32)

    bar = None
    if cfg.progress:
        # Documents per input are unknown up front: count documents, show file i/n and tokens.
        bar = tqdm(desc="tokenize", unit="doc", dynamic_ncols=True)
    for i, entry in enumerate(inputs):
        if i < state.next_input:
            continue
        path = cfg.inputs[i]
        skip = state.next_doc if i == state.next_input else 0
        pending: list[tuple[int, str]] = []

        # Bound explicitly: flush runs only within the iteration that defined it.
        def flush(pending: list[tuple[int, str]] = pending, i: int = i) -> None:
            texts = [t for _, t in pending]
            encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
            for (doc_idx, _), ids in zip(pending, encoded):
                if not ids:
                    writer.skip_empty()
                    continue
                writer.add(np.concatenate([np.asarray(ids, dtype=np.uint32), eos]), i, doc_idx)
            if bar is not None:
                bar.update(len(pending))
                bar.set_postfix(file=f"{i + 1}/{len(inputs)}", tokens=sum(e["tokens"] for e in state.inputs),
                                refresh=False)
            pending.clear()

        for doc_idx, (_, text) in enumerate(iter_documents(path, entry["format"], cfg.text_field, cfg.txt_docs)):
            if doc_idx < skip:
                continue
            pending.append((doc_idx, text))
            if len(pending) >= cfg.batch_docs:
                flush()
        flush()
    writer.close(len(inputs), 0)
    if bar is not None:
        bar.close()

    index = {"format": "osprey-corpus", "version": 1, "dtype": "uint32", "tokenizer": ident,
             "text_field": cfg.text_field, "txt_docs": cfg.txt_docs, "shard_tokens": cfg.shard_tokens,
             "inputs": state.inputs, "shards": state.shards,
             "num_tokens": int(sum(s["tokens"] for s in state.shards)),
             "num_documents": int(sum(s["documents"] for s in state.shards)),
             "skipped_empty": int(state.skipped_empty), "created_unix": time.time(), "identity": identity_doc}
    validate(index, INDEX_SCHEMA, where=str(index_path))
    write_json(index_path, index)
    (cfg.out_dir / PROGRESS_NAME).unlink(missing_ok=True)
    return index

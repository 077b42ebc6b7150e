"""Reading conversation files: JSONL / JSON / Parquet files and saved ``datasets`` folders.

Every record becomes an :class:`InputSample` with a normalized conversation
(``[{"role", "content"}]``). Accepted record shapes, checked in this order:

* ``conversations`` or ``messages``: a list of ``{role, content}`` or ShareGPT ``{from, value}``;
* ``prompt``: a bare user prompt (optional ``system``);
* ``text``: pre-formatted text, stored as is (no chat template, no regeneration).

``id``, ``domain``, ``source`` and ``reference`` are kept when present. A missing id is derived
from the content (sha256 of its canonical JSON), so it is stable across runs and machines —
the builder's resume and worker partition key on it. A record repeating an earlier one's content
(and having no id) gets the suffix ``~2``, ``~3``... by occurrence; a repeated explicit id is an
error.

A malformed record raises :class:`InputError` naming file and line, or, with
``on_error="skip"``, is handed to the error callback (the store's errors file) and counted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from osprey_data import jsonio
from osprey_data.errors import InputError
from osprey_data.parquet_input import checked_batches

__all__ = ["InputSample", "iter_inputs", "normalize_record", "read_records", "ROLE_ALIASES", "stable_id"]

# ShareGPT and friends use other role names; everything maps onto four roles.
ROLE_ALIASES = {
    "user": "user", "human": "user", "prompter": "user",
    "assistant": "assistant", "gpt": "assistant", "model": "assistant", "bot": "assistant",
    "chatgpt": "assistant", "bing": "assistant",
    "system": "system",
    "tool": "tool", "function": "tool", "ipython": "tool",
}


@dataclass(kw_only=True)
class InputSample:
    """One normalized input record."""

    sample_id: str
    domain: str
    source: str
    conversation: list[dict[str, str]] = field(default_factory=list)
    reference: str | None = None
    text: str | None = None
    file: str = ""
    line: int = 0

    @property
    def is_text(self) -> bool:
        return self.text is not None


def stable_id(content: Any) -> str:
    """A 16-hex-digit id derived from the record's content (same content -> same id)."""
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _check_unicode(value: str, where: str, what: str) -> str:
    """``value`` unchanged, or InputError when it cannot be UTF-8 text: a lone surrogate (JSON
    allows ``"\\ud800"``; ShareGPT dumps contain them) would crash the tokenizer, the sample id
    hash or the Arrow table much later, without naming the record."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{where}: {what} holds a lone surrogate U+{ord(value[exc.start]):04X} at character "
                         f"{exc.start}, which is not valid Unicode text; fix or drop the record") from None
    return value


def _normalize_turns(turns: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(turns, list) or not turns:
        raise InputError(f"{where}: 'conversations'/'messages' must be a non-empty list of turns")
    out: list[dict[str, str]] = []
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise InputError(f"{where}: turn {j} is {type(turn).__name__}, expected an object")
        if "role" in turn:
            role, content = turn.get("role"), turn.get("content")
        elif "from" in turn:
            role, content = turn.get("from"), turn.get("value")
        else:
            raise InputError(f"{where}: turn {j} has neither 'role'/'content' nor ShareGPT 'from'/'value'")
        if not isinstance(role, str) or role.lower() not in ROLE_ALIASES:
            raise InputError(f"{where}: turn {j} has unknown role {role!r}; known: {sorted(ROLE_ALIASES)}")
        if not isinstance(content, str):
            raise InputError(f"{where}: turn {j} content must be a string, got {type(content).__name__}")
        out.append({"role": ROLE_ALIASES[role.lower()], "content": content})
    return out


def normalize_record(record: Any, *, file: str, line: int, default_source: str) -> InputSample:
    """Turn one parsed record into an :class:`InputSample` (raises InputError naming file:line)."""
    where = f"{file}:{line}"
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(record).__name__}")
    reference = record.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise InputError(f"{where}: 'reference' must be a string")
    conversation: list[dict[str, str]] = []
    text: str | None = None
    if record.get("conversations") is not None or record.get("messages") is not None:
        turns = record.get("conversations") if record.get("conversations") is not None else record["messages"]
        conversation = _normalize_turns(turns, where)
    elif record.get("prompt") is not None:
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise InputError(f"{where}: 'prompt' must be a non-empty string")
        if record.get("system") is not None:
            if not isinstance(record["system"], str):
                raise InputError(f"{where}: 'system' must be a string")
            conversation.append({"role": "system", "content": record["system"]})
        conversation.append({"role": "user", "content": record["prompt"]})
    elif record.get("text") is not None:
        if not isinstance(record["text"], str) or not record["text"]:
            raise InputError(f"{where}: 'text' must be a non-empty string")
        text = record["text"]
    else:
        raise InputError(f"{where}: record has none of 'conversations', 'messages', 'prompt', 'text'")
    if conversation and all(t["role"] != "user" for t in conversation):
        raise InputError(f"{where}: conversation has no user turn")
    for what, value in (("'reference'", reference), ("'text'", text),
                        *((f"turn {j} content", t["content"]) for j, t in enumerate(conversation))):
        if isinstance(value, str):
            _check_unicode(value, where, what)  # before stable_id hashes them
    raw_id = record.get("id")
    if raw_id is None:
        sample_id = stable_id({"conversation": conversation, "text": text, "reference": reference})
    elif isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) and str(raw_id):
        sample_id = str(raw_id)
    else:
        raise InputError(f"{where}: 'id' must be a non-empty string or integer, got {raw_id!r}")
    for key in ("domain", "source"):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise InputError(f"{where}: {key!r} must be a string")
    for what, value in (("'id'", sample_id), ("'domain'", record.get("domain")), ("'source'", record.get("source"))):
        if isinstance(value, str):
            _check_unicode(value, where, what)
    return InputSample(
        sample_id=sample_id,
        domain=record.get("domain") or "default",
        source=record.get("source") or default_source,
        conversation=conversation,
        reference=reference,
        text=text,
        file=file,
        line=line,
    )


# --- raw record readers: (file label, line number, parsed record or the parse error) ----------

RawRecord = tuple[str, int, Any, Exception | None]


def _read_jsonl(path: Path) -> Iterator[RawRecord]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                yield str(path), lineno, jsonio.loads(raw), None
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                yield str(path), lineno, None, InputError(f"{path}:{lineno}: not valid JSON ({exc})")


def _read_json(path: Path) -> Iterator[RawRecord]:
    try:
        doc = jsonio.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); expected a list of records") from None
    if isinstance(doc, dict):
        # {"data": [...]}-style wrappers: exactly one list-valued key.
        lists = [v for v in doc.values() if isinstance(v, list)]
        if len(lists) != 1 or any(k in doc for k in ("conversations", "messages", "prompt", "text")):
            doc = [doc]
        else:
            doc = lists[0]
    if not isinstance(doc, list):
        raise InputError(f"{path}: expected a JSON list of records, got {type(doc).__name__}")
    for i, record in enumerate(doc, start=1):
        yield str(path), i, record, None


def _read_parquet(path: Path) -> Iterator[RawRecord]:
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for bad files
        raise InputError(f"{path}: cannot read as Parquet ({exc})") from None
    row = 0
    # single-threaded: threaded Parquet reads can abort the interpreter at exit (apache/arrow#34314)
    for batch in checked_batches(pf.iter_batches(batch_size=1024, use_threads=False), path):
        for record in batch.to_pylist():
            row += 1
            yield str(path), row, record, None


def _read_datasets_folder(path: Path) -> Iterator[RawRecord]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise InputError(f"{path}: cannot open as a saved `datasets` folder ({exc})") from None
    splits = [(name, ds[name]) for name in sorted(ds)] if isinstance(ds, datasets.DatasetDict) \
        else [(None, ds)]
    for name, split in splits:
        label = f"{path}[{name}]" if name else str(path)
        for i, record in enumerate(split, start=1):
            yield label, i, record, None


READERS: dict[str, Callable[[Path], Iterator[RawRecord]]] = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".parquet": _read_parquet,
    "datasets": _read_datasets_folder,
}


def _reader_for(path: Path) -> Callable[[Path], Iterator[RawRecord]]:
    if path.is_dir():
        return READERS["datasets"]
    suffix = path.suffix.lower()
    if suffix not in READERS:
        raise InputError(f"{path}: unsupported input type {suffix!r}; use .jsonl, .json, .parquet "
                         f"or a saved `datasets` folder")
    return READERS[suffix]


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The raw records of one input (any format above), in order, unnormalized: for selecting
    prompts and writing them back as JSONL. A malformed record is an :class:`InputError` naming
    file:line."""
    path = Path(path)
    records = []
    for label, line, record, error in _reader_for(path)(path):
        if error is not None:
            raise error
        if not isinstance(record, dict):
            raise InputError(f"{label}:{line}: expected a JSON object (one record), got {type(record).__name__}")
        records.append(record)
    if not records:
        raise InputError(f"{path}: no records")
    return records


def _has_explicit_id(record: Any) -> bool:
    return isinstance(record, dict) and record.get("id") is not None


ErrorSink = Callable[[str | None, str | None, int | None, str], None]


def iter_inputs(paths: list[str] | tuple[str, ...], *, on_error: str = "raise",
                error_sink: ErrorSink | None = None) -> Iterator[InputSample]:
    """Yield normalized samples of every input in order; duplicate ids are errors too.

    Args:
        paths: files or ``datasets`` folders.
        on_error: ``"raise"`` or ``"skip"``; with skip, ``error_sink(sample_id, file, line,
            reason)`` receives every bad record.
    """
    if on_error == "skip" and error_sink is None:
        raise ValueError("on_error='skip' needs an error_sink: nothing is skipped silently")
    for p in paths:
        if not Path(p).exists():
            raise InputError(f"input {p!r} does not exist")
    # id -> where it was first seen, packed as file number * 2**40 + line: an int per record, not a
    # "file:line" string (10^6 records held 10^6 of those)
    seen: dict[str, int] = {}
    labels: list[str] = []
    for p in paths:
        path = Path(p)
        reader = _reader_for(path)
        source = path.stem   # one string per input, not one per record
        for file, line, record, error in reader(path):
            try:
                if error is not None:
                    raise error
                sample = normalize_record(record, file=file, line=line, default_source=source)
                if sample.sample_id in seen and not _has_explicit_id(record):
                    # Identical content without an id: a repeat in the data, kept as its own
                    # sample under an occurrence suffix (stable for the same inputs).
                    n = 2
                    while f"{sample.sample_id}~{n}" in seen:
                        n += 1
                    sample.sample_id = f"{sample.sample_id}~{n}"
                if sample.sample_id in seen:
                    first = seen[sample.sample_id]
                    raise InputError(f"{file}:{line}: duplicate sample id {sample.sample_id!r} (first seen at "
                                     f"{labels[first >> 40]}:{first & (2 ** 40 - 1)}); ids must be unique")
                if not labels or labels[-1] != file:
                    labels.append(file)
                seen[sample.sample_id] = (len(labels) - 1) << 40 | line
            except InputError as exc:
                if on_error == "raise":
                    raise
                rid = record.get("id") if isinstance(record, dict) else None
                if rid is not None:  # the journal is UTF-8 JSON: a surrogate in the id is escaped
                    rid = str(rid).encode("utf-8", "backslashreplace").decode("utf-8")
                assert error_sink is not None
                error_sink(rid, file, line, str(exc))
                continue
            yield sample

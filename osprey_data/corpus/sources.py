"""Document sources of a pretraining corpus: text files, JSONL, Parquet and `datasets` folders.

Each reader yields ``(where, text)`` pairs in a stable order, ``where`` being the 1-based line
(JSONL, text), row (Parquet, datasets) or paragraph number used in error messages and for
resuming. Readers validate as they go: a record without the text field, or with a non-string
value, raises :class:`InputError` naming the file and line/row and what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq

from osprey_data import jsonio
from osprey_data.errors import InputError
from osprey_data.parquet_input import checked_batches

__all__ = ["SOURCES", "detect_format", "iter_documents", "TXT_DOC_MODES"]

TXT_DOC_MODES = ("file", "paragraph", "line")


def _iter_jsonl(path: Path, text_field: str, txt_docs: str) -> Iterator[tuple[int, str]]:
    with path.open("r", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = jsonio.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{line_no}: not valid JSON ({exc.msg}); fix or remove this line") from None
            if not isinstance(record, dict) or text_field not in record:
                fields = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise InputError(f"{path}:{line_no}: no '{text_field}' field (found {fields}); "
                                 "pass --text-field with the name of the text field")
            text = record[text_field]
            if not isinstance(text, str):
                raise InputError(f"{path}:{line_no}: field '{text_field}' is {type(text).__name__}, expected a string")
            yield line_no, text


def _iter_txt(path: Path, text_field: str, txt_docs: str) -> Iterator[tuple[int, str]]:
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); convert it to UTF-8") from None
    if txt_docs == "file":
        yield 1, content
    elif txt_docs == "line":
        for line_no, line in enumerate(content.splitlines(), start=1):
            yield line_no, line
    else:  # paragraph: blank-line separated blocks
        block: list[str] = []
        start = 1
        for line_no, line in enumerate(content.splitlines(), start=1):
            if line.strip():
                if not block:
                    start = line_no
                block.append(line)
            elif block:
                yield start, "\n".join(block)
                block = []
        if block:
            yield start, "\n".join(block)


def _check_column(path: Path, names: list[str], text_field: str) -> None:
    if text_field not in names:
        raise InputError(f"{path}: no '{text_field}' column (columns: {names}); pass --text-field with the "
                         "name of the text column")


def _iter_parquet(path: Path, text_field: str, txt_docs: str) -> Iterator[tuple[int, str]]:
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:   # pyarrow raises several unrelated types for a bad file
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    _check_column(path, pf.schema_arrow.names, text_field)
    row = 0
    # single-threaded: threaded Parquet reads can abort the interpreter at exit (apache/arrow#34314)
    for batch in checked_batches(pf.iter_batches(columns=[text_field], batch_size=1024, use_threads=False),
                                 path):
        for value in batch.column(0).to_pylist():
            row += 1
            if not isinstance(value, str):
                raise InputError(f"{path}: row {row}: '{text_field}' is {type(value).__name__}, expected a string")
            yield row, value


def _iter_datasets(path: Path, text_field: str, txt_docs: str) -> Iterator[tuple[int, str]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise InputError(f"{path}: not a `datasets` folder saved with save_to_disk ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        raise InputError(f"{path}: holds several splits {sorted(ds)}; pass the folder of one split "
                         f"(e.g. {path}/{sorted(ds)[0]})")
    _check_column(path, list(ds.column_names), text_field)
    for row, record in enumerate(ds.select_columns([text_field]), start=1):
        value = record[text_field]
        if not isinstance(value, str):
            raise InputError(f"{path}: row {row}: '{text_field}' is {type(value).__name__}, expected a string")
        yield row, value


# format name -> reader(path, text_field, txt_docs)
SOURCES: dict[str, Callable[[Path, str, str], Iterator[tuple[int, str]]]] = {
    "jsonl": _iter_jsonl,
    "txt": _iter_txt,
    "parquet": _iter_parquet,
    "datasets": _iter_datasets,
}

_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".txt": "txt", ".text": "txt",
             ".md": "txt", ".parquet": "parquet", ".pq": "parquet"}


def detect_format(path: Path) -> str:
    """Format name of ``path`` (by suffix, or ``datasets`` for a save_to_disk folder)."""
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if path.is_dir():
        markers = ("dataset_info.json", "state.json", "dataset_dict.json")
        if any((path / m).is_file() for m in markers):
            return "datasets"
        raise InputError(f"{path}: a folder but not a `datasets` save_to_disk folder (no {markers[0]}/"
                         f"{markers[1]}); pass files instead")
    fmt = _SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"{path}: unknown corpus format '{path.suffix}'; use .txt, .jsonl or .parquet "
                         "files or a `datasets` folder")
    return fmt


def iter_documents(path: Path, fmt: str, text_field: str, txt_docs: str) -> Iterator[tuple[int, str]]:
    """``(where, text)`` of every document of ``path``."""
    return SOURCES[fmt](path, text_field, txt_docs)

"""Reading a user's Parquet input file batch by batch with errors that name it.

``pq.ParquetFile`` reads only the footer when it opens a file; a damaged page (a corrupt snappy
or zstd block, a truncated column chunk) fails later, inside ``iter_batches``, with an
``OSError`` such as ``Corrupt snappy compressed data.`` that names no file. Prompt files and
corpus files are read through :func:`checked_batches` so that it becomes one
:class:`~osprey_data.errors.InputError` naming the file and the rows already read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from osprey_data.errors import InputError

__all__ = ["checked_batches"]


def checked_batches(batches: Iterator[Any], path: str | Path) -> Iterator[Any]:
    """Yield from ``batches`` (``ParquetFile.iter_batches(...)``); a decoding failure while
    fetching the next batch is an InputError naming ``path`` (errors of the caller's own loop
    body are not touched: they happen outside this generator)."""
    rows = 0
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except InputError:
            raise
        except Exception as exc:   # pyarrow raises OSError, ArrowInvalid, ... for damaged pages
            raise InputError(f"{path}: damaged Parquet data after row {rows} ({type(exc).__name__}: {exc}); "
                             "rewrite or re-download the file") from None
        rows += batch.num_rows
        yield batch

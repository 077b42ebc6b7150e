"""The records a build skipped, compactly: runs of input lines per file and reason code.

A worker journal used to list every skipped record in full (sample id, file, line, message):
10^6 bad lines made a 332 MB journal that the writer rewrote after every shard and every merge
re-read and schema-checked for minutes. The journal now keeps (schema
``store-worker-journal.v1.json``):

- ``skipped``: per input file and reason code (the message's text before its first ``:``, e.g.
  ``input_error``, ``too_long``), the skipped lines as ``[first, last]`` runs: a million
  consecutive bad lines are one run;
- ``errors``: a bounded sample of full entries, the first :data:`MESSAGES_PER_CODE` of each code
  (same shape as before, so a human can read why), plus every entry without a line number
  (which no run can hold);
- ``num_errors``: how many records were skipped in all.

Resuming keys on (file, line, code): a line already in a run of that code is not recorded again,
and a sample skipped while building (``too_long``, ``non_finite``) is not built again; a line
recorded as ``input_error`` that now parses (the file was fixed) is built. A journal written
before (``errors`` only, no ``skipped``) is read as such: its entries become runs.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

from osprey_data.errors import StoreCorruptError

__all__ = ["SkipLog", "MESSAGES_PER_CODE", "reason_code"]

MESSAGES_PER_CODE = 20
"""Full entries (with their message) kept per reason code; the rest are counted in runs."""


def reason_code(reason: str) -> str:
    """``input_error`` of ``input_error: ...`` (the builder's reasons all start with their code)."""
    return reason.split(":", 1)[0].strip()[:64] or "error"


class _Runs:
    """Disjoint, sorted, non-adjacent ``[first, last]`` line runs."""

    __slots__ = ("firsts", "lasts")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.lasts: list[int] = []

    def __contains__(self, line: int) -> bool:
        k = bisect.bisect_right(self.firsts, line) - 1
        return k >= 0 and line <= self.lasts[k]

    def add(self, line: int) -> None:
        """Add ``line`` (not already held): extends a neighbouring run, joins two, or starts one."""
        k = bisect.bisect_right(self.firsts, line) - 1   # the run starting at or before line
        joins_left = k >= 0 and self.lasts[k] == line - 1
        joins_right = k + 1 < len(self.firsts) and self.firsts[k + 1] == line + 1
        if joins_left and joins_right:
            self.lasts[k] = self.lasts[k + 1]
            del self.firsts[k + 1], self.lasts[k + 1]
        elif joins_left:
            self.lasts[k] = line
        elif joins_right:
            self.firsts[k + 1] = line
        else:
            self.firsts.insert(k + 1, line)
            self.lasts.insert(k + 1, line)

    def count(self) -> int:
        return sum(b - a + 1 for a, b in zip(self.firsts, self.lasts))


class SkipLog:
    """Skipped records of one worker: runs per (file, code), sample messages, a total."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], _Runs] = {}
        self._messages: list[dict] = []
        self._per_code: dict[str, int] = {}
        self._unplaced: set[tuple] = set()
        self.total = 0

    def __len__(self) -> int:
        return self.total

    def holds(self, file: str | None, line: int | None, codes: tuple[str, ...] | None = None) -> bool:
        """Whether the record at ``file:line`` is recorded as skipped (for one of ``codes``, or any)."""
        if file is None or line is None:
            return False
        return any(line in runs for (f, code), runs in self._runs.items()
                   if f == file and (codes is None or code in codes))

    def add(self, *, sample_id: str | None, file: str | None, line: int | None, reason: str) -> bool:
        """Record one skipped record; False (and nothing recorded) when its line already is, with
        the same reason code."""
        reason = str(reason)
        entry = {"sample_id": sample_id, "file": file, "line": line, "reason": reason}
        code = reason_code(reason)
        if file is None or line is None:   # no line to put in a run: kept in full (rare)
            key = (sample_id, file, line, reason)
            if key in self._unplaced:
                return False
            self._unplaced.add(key)
            self._messages.append(entry)
        else:
            runs = self._runs.get((file, code))
            if runs is None:
                runs = self._runs[file, code] = _Runs()
            elif line in runs:   # a resumed run meets the same record, skipped for the same reason
                return False
            runs.add(int(line))
            if self._per_code.get(code, 0) < MESSAGES_PER_CODE:
                self._messages.append(entry)
        self._per_code[code] = self._per_code.get(code, 0) + 1
        self.total += 1
        return True

    def lines(self) -> Iterator[tuple[str, int]]:
        """Every recorded (file, line), run by run."""
        for (file, _code), runs in self._runs.items():
            for first, last in zip(runs.firsts, runs.lasts):
                for line in range(first, last + 1):
                    yield file, line

    def messages(self) -> list[dict]:
        """The full entries kept (the first ones of each code, and those without a line)."""
        return [dict(e) for e in self._messages]

    def to_doc(self) -> dict[str, Any]:
        """The journal fields ``errors``, ``skipped`` and ``num_errors``."""
        skipped = [{"file": file, "code": code, "runs": [[a, b] for a, b in zip(r.firsts, r.lasts)]}
                   for (file, code), r in self._runs.items()]
        return {"errors": self.messages(), "skipped": skipped, "num_errors": self.total}

    @classmethod
    def from_doc(cls, doc: dict[str, Any], where: str) -> SkipLog:
        """Read the fields of :meth:`to_doc` back; a journal without ``skipped`` (written before
        this format) lists every skipped record in ``errors``: each becomes part of a run."""
        log = cls()
        if "skipped" not in doc:
            for e in doc["errors"]:
                log.add(sample_id=e["sample_id"], file=e["file"], line=e["line"], reason=e["reason"])
            return log
        try:
            for item in doc["skipped"]:
                file, code = item["file"], item["code"]
                runs = log._runs.setdefault((file, code), _Runs())
                last = None
                for first, end in item["runs"]:
                    if not (isinstance(first, int) and isinstance(end, int) and first <= end
                            and (last is None or first > last + 1)):
                        raise ValueError(f"run {[first, end]} is not an increasing, disjoint [first, last] pair")
                    runs.firsts.append(first)
                    runs.lasts.append(end)
                    last = end
                log._per_code[code] = log._per_code.get(code, 0) + runs.count()
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreCorruptError(f"{where}: malformed 'skipped' entry ({exc}); the journal is damaged") from None
        for e in doc["errors"]:
            log._messages.append(dict(e))
            if e["file"] is None or e["line"] is None:
                log._unplaced.add((e["sample_id"], e["file"], e["line"], e["reason"]))
                code = reason_code(e["reason"])
                log._per_code[code] = log._per_code.get(code, 0) + 1
        log.total = sum(log._per_code.values())
        if log.total != doc["num_errors"]:
            raise StoreCorruptError(f"{where}: num_errors {doc['num_errors']} but its runs and entries hold "
                                    f"{log.total} skipped records; the journal is damaged")
        return log

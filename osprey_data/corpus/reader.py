"""Memory-mapped reading of a tokenized corpus, and fixed-length random windows over it.

:class:`TokenCorpus` opens ``index.json`` (validated against ``schemas/corpus-index.v1.json``)
and memory-maps every shard (``numpy.memmap``, read-only), presenting them as ONE token stream
addressed by global offset. :class:`WindowSampler` cuts a token range into non-overlapping
windows of ``length`` tokens and visits them in a seeded random order, epoch after epoch (each
epoch reshuffles and shifts the window grid by a random offset, so later epochs see new
boundaries). Sample ``i`` is a pure function of ``(seed, i)``: trainers give ranks disjoint
sample indices, which makes the data disjoint across ranks and exactly resumable.

Legend: B batch, T tokens per window.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from osprey_data import jsonio
from osprey_data.errors import InputError
from osprey_data.schema_check import validate

__all__ = ["TokenCorpus", "WindowSampler"]


class TokenCorpus:
    """A tokenized corpus folder as one memory-mapped uint32 token stream."""

    def __init__(self, path: str | Path, *, verify: bool = False) -> None:
        self.path = Path(path)
        index_path = self.path / "index.json"
        if not index_path.is_file():
            hint = " (tokenization unfinished: rerun the same tokenize-corpus command)" \
                if (self.path / "progress.json").is_file() else ""
            raise InputError(f"{self.path}: no index.json, not a tokenized corpus{hint}; create one with "
                             "`osprey data tokenize-corpus`")
        try:
            self.index: dict[str, Any] = jsonio.loads(index_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"{index_path}: not valid JSON ({exc.msg})") from None
        validate(self.index, "corpus-index.v1.json", where=str(index_path))
        self.tokenizer: dict[str, Any] = self.index["tokenizer"]
        self.eos_id: int = int(self.tokenizer["eos_token_id"])
        self._shards: list[np.ndarray] = []
        starts = [0]
        for shard in self.index["shards"]:
            file = self.path / shard["file"]
            if not file.is_file() or file.stat().st_size != 4 * shard["tokens"]:
                raise InputError(f"{file}: missing or of the wrong size (index says {shard['tokens']} tokens); "
                                 "the corpus is damaged, tokenize again")
            mm = np.memmap(file, dtype="<u4", mode="r")
            if verify and hashlib.sha256(mm.tobytes()).hexdigest() != shard["sha256"]:
                raise InputError(f"{file}: sha256 does not match index.json; the shard is corrupt, tokenize again")
            self._shards.append(mm)
            starts.append(starts[-1] + int(shard["tokens"]))
        self._starts = np.asarray(starts, dtype=np.int64)
        self.num_tokens = int(self._starts[-1])

    def __len__(self) -> int:
        return self.num_tokens

    def tokens(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` of the stream (a copy, int64), across shards."""
        if start < 0 or length < 0 or start + length > self.num_tokens:
            raise IndexError(f"range [{start}, {start + length}) outside the corpus of {self.num_tokens} tokens")
        out = np.empty(length, dtype=np.int64)
        pos, filled = start, 0
        while filled < length:
            k = int(np.searchsorted(self._starts, pos, side="right")) - 1
            local = pos - int(self._starts[k])
            take = min(length - filled, int(self._starts[k + 1]) - pos)
            out[filled:filled + take] = self._shards[k][local:local + take]
            filled += take
            pos += take
        return out

    def next_document_start(self, pos: int, search: int = 1 << 20) -> int:
        """First offset >= ``pos`` that starts a document (just after an EOS); ``pos`` if none nearby."""
        if pos <= 0:
            return 0
        chunk = self.tokens(pos - 1, min(search, self.num_tokens - pos + 1))
        hits = np.flatnonzero(chunk == self.eos_id)
        return pos + int(hits[0]) if hits.size else pos

    def split(self, heldout_fraction: float, *, min_heldout: int = 0) -> tuple[tuple[int, int], tuple[int, int]]:
        """(train range, held-out range): the held-out part is the END of the stream, from a document start."""
        if not 0.0 <= heldout_fraction < 1.0:
            raise ValueError("heldout_fraction must be in [0, 1)")
        if heldout_fraction == 0.0 and min_heldout == 0:
            return (0, self.num_tokens), (self.num_tokens, self.num_tokens)
        want = max(int(self.num_tokens * heldout_fraction), min_heldout)
        cut = self.next_document_start(max(self.num_tokens - want, 0))
        if self.num_tokens - cut < min_heldout:
            cut = max(self.num_tokens - want, 0)   # documents too long to cut cleanly: cut mid-document
        return (0, cut), (cut, self.num_tokens)


class WindowSampler:
    """Seeded, epoch-wise shuffled, non-overlapping windows of ``length`` tokens in ``[start, end)``."""

    def __init__(self, corpus: TokenCorpus, start: int, end: int, length: int, seed: int) -> None:
        self.corpus, self.start, self.end, self.length, self.seed = corpus, int(start), int(end), int(length), seed
        # One window of slack so every epoch's random grid offset still fits the same count.
        self.windows_per_epoch = (self.end - self.start - (self.length - 1)) // self.length
        if self.windows_per_epoch < 1:
            raise InputError(f"{corpus.path}: range of {self.end - self.start} tokens is too small for windows of "
                             f"{self.length} tokens (plus one of slack); use a shorter --seq-len or a bigger corpus")

    # The cache holds its samplers alive; a run has one or two, which live as long as the run.
    @lru_cache(maxsize=4)  # noqa: B019
    def _epoch(self, epoch: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng([self.seed, epoch, 0x05B1])
        slack = self.end - self.start - self.windows_per_epoch * self.length
        offset = int(rng.integers(0, slack + 1))
        return rng.permutation(self.windows_per_epoch), offset

    def window_start(self, i: int) -> int:
        """Stream offset of sample ``i`` (a pure function of ``seed`` and ``i``)."""
        epoch, j = divmod(int(i), self.windows_per_epoch)
        order, offset = self._epoch(epoch)
        return self.start + offset + int(order[j]) * self.length

    def window(self, i: int) -> np.ndarray:
        """Tokens of sample ``i`` (``length`` int64 ids)."""
        return self.corpus.tokens(self.window_start(i), self.length)

    def batch(self, first: int, count: int) -> np.ndarray:
        """Samples ``first .. first + count - 1`` stacked: ``ids_BT`` (count, length) int64."""
        return np.stack([self.window(first + k) for k in range(count)])

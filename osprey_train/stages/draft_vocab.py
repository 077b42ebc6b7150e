"""The reduced draft vocabulary (EAGLE-3's mechanism), shared by every architecture's convert.

The ``--draft-vocab N`` target tokens that occur most often at loss-masked positions of the store
(ties broken by lower id; if the store has fewer distinct tokens, the remaining slots take the
lowest unused target ids), sorted by target id so that the engines' offset map
``d2t[i] = target_id - i`` is non-negative. Its statistics go to ``draft_vocab.json``.

Legend: V target vocab.
"""

from __future__ import annotations

import numpy as np

from osprey_data.errors import ConfigError, StoreError
from osprey_data.store import StoreReader

__all__ = ["VOCAB_FILE", "loss_masked_token_counts", "check_draft_vocab_size", "select_draft_vocab",
           "draft_vocab_from_store"]

VOCAB_FILE = "draft_vocab.json"


def loss_masked_token_counts(store: str, vocab_size: int) -> np.ndarray:
    """(V,) int64 counts of target token ids at loss-masked positions over the whole store."""
    table = StoreReader(store).table(columns=["token_ids", "loss_mask"])
    counts = np.zeros(vocab_size, dtype=np.int64)
    ids_col, mask_col = table.column("token_ids"), table.column("loss_mask")
    for row in range(table.num_rows):
        ids = np.asarray(ids_col[row].as_py(), dtype=np.int64)
        mask = np.asarray(mask_col[row].as_py()).astype(bool)
        if ids.shape != mask.shape:
            raise StoreError(f"store {store}: sample {row} has {ids.size} token ids but {mask.size} mask entries")
        picked = ids[mask]
        if picked.size and (picked.min() < 0 or picked.max() >= vocab_size):
            raise StoreError(f"store {store}: sample {row} has token ids outside [0, {vocab_size})")
        counts += np.bincount(picked, minlength=vocab_size)
    return counts


def check_draft_vocab_size(size: int, vocab: int, *, source: str | None = None) -> None:
    """Refuse a draft vocabulary larger than the target's (``source``: where ``vocab`` was read)."""
    if size > vocab:
        read = f" (per {source})" if source else ""
        raise ConfigError(f"convert: --draft-vocab {size} exceeds the target vocabulary ({vocab}){read}; "
                          f"pass --draft-vocab {vocab} or less")


def select_draft_vocab(counts_V: np.ndarray, size: int) -> np.ndarray:
    """Top-``size`` ids by count (ties: lower id first), padded with unused low ids, sorted ascending."""
    vocab = counts_V.shape[0]
    check_draft_vocab_size(size, vocab)
    order = np.lexsort((np.arange(vocab), -counts_V))  # by count desc, then id asc
    return np.sort(order[:size])


def draft_vocab_from_store(store: str, vocab_size: int, size: int) -> tuple[np.ndarray, dict]:
    """The draft vocabulary of ``size`` target ids chosen from ``store`` and its ``draft_vocab.json`` stats.

    Shared by the EAGLE-3 init and the Osprey conversion with ``--draft-vocab``.
    """
    counts = loss_masked_token_counts(store, vocab_size)
    draft_ids = select_draft_vocab(counts, size)
    total = int(counts.sum())
    stats = {
        "draft_vocab_size": int(draft_ids.shape[0]), "target_vocab_size": vocab_size,
        "loss_masked_tokens": total, "distinct_loss_masked_tokens": int((counts > 0).sum()),
        "coverage": round(float(counts[draft_ids].sum()) / total, 6) if total else 0.0,
        "store": str(store),
    }
    return draft_ids, stats

"""``merge_store`` (``osprey data merge``): publish the shards of every worker journal, lock-free.

Several workers never write ``manifest.json`` themselves (see :mod:`osprey_data.store.journal`);
merging recomputes it from all journals, checking that they belong to this store, that no
sample is in two shards and that every shard already visible is still journaled. Run it after
(or even while) the workers write, and as often as wanted: it is idempotent, and merges racing
each other never hide a shard (the manifest is replaced by compare-and-swap, see
:func:`osprey_data.store.journal.publish`).
"""

from __future__ import annotations

from osprey_data.store.fs import StoreFS
from osprey_data.store.journal import publish, read_manifest
from osprey_data.store.manifest import Manifest

__all__ = ["merge_store"]


def merge_store(url: str, storage_options: dict | None = None) -> Manifest:
    """Make the shards of every worker journal visible in manifest.json (idempotent).

    Checks that every journal was written for this store's header, that no sample id is in
    two shards and that every shard already visible is still journaled. Safe to run while
    workers write and while other merges run (compare-and-swap, see ``journal.publish``).
    """
    fs = StoreFS(url, storage_options=storage_options, read_only=False)
    return publish(fs, read_manifest(fs).header, check_duplicates=True)

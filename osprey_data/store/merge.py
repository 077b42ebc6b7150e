"""``merge_store`` (``osprey data merge``): publish the shards of every worker journal, lock-free.

Several workers never write ``manifest.json`` themselves (see :mod:`osprey_data.store.journal`);
merging recomputes it from all journals, checking that they belong to this store and that no
sample is in two shards. Run it after (or even while) the workers write; it is idempotent.
"""

from __future__ import annotations

from osprey_data.errors import StoreCorruptError
from osprey_data.store.fs import StoreFS
from osprey_data.store.journal import MANIFEST_FILE, publish, read_manifest
from osprey_data.store.manifest import Manifest

__all__ = ["merge_store"]


def merge_store(url: str, storage_options: dict | None = None) -> Manifest:
    """Make the shards of every worker journal visible in manifest.json (idempotent).

    Checks that every journal was written for this store's header and that no sample id is
    in two shards. Needs no lock: workers never write manifest.json when ``num_workers > 1``.
    """
    fs = StoreFS(url, storage_options=storage_options, read_only=False)
    manifest = read_manifest(fs)
    for info in manifest.shards:  # shards visible before must stay visible
        if not any(n == f"{info.worker}.json" for n in fs.listdir("workers")):
            raise StoreCorruptError(f"{fs.where(MANIFEST_FILE)}: lists shard {info.shard_id} of worker "
                                    f"{info.worker} whose journal is missing")
    merged = publish(fs, manifest.header, check_duplicates=True)
    lost = {s.shard_id for s in manifest.shards} - {s.shard_id for s in merged.shards}
    if lost:  # pragma: no cover - journals only grow
        raise StoreCorruptError(f"merge would drop shards {sorted(lost)}")
    return merged

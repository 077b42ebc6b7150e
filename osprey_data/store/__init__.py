"""Osprey feature store: sharded Zarr v3 + Parquet files of target features for distillation.

See docs/store.md for the on-disk layout. Public API::

    StoreWriter(url, header, worker_index=0, num_workers=1)  -> add / close / done_sample_ids
    StoreReader(url)                                          -> sample(i) / iter_samples / table
    merge_store(url), validate_store(url), inspect_store(url)
"""

from __future__ import annotations

from osprey_data.store.codecs import HIDDEN_CODECS
from osprey_data.store.inspect import inspect_store
from osprey_data.store.manifest import Manifest, ShardInfo, StoreHeader
from osprey_data.store.merge import merge_store
from osprey_data.store.reader import StoreReader
from osprey_data.store.records import Sample, SampleRecord
from osprey_data.store.validate import validate_store
from osprey_data.store.writer import StoreWriter

# The header's target fields; their home is osprey_data.target_model.
from osprey_data.target_model import TapLayers, TargetIdentity

__all__ = [
    "TargetIdentity", "TapLayers", "StoreHeader", "SampleRecord", "Sample", "ShardInfo", "Manifest",
    "StoreWriter", "StoreReader", "merge_store", "validate_store", "inspect_store", "HIDDEN_CODECS",
]

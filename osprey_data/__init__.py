"""Osprey data: feature stores (sharded Zarr + Arrow), the builder, pretraining corpora."""

"""Drafter architectures: one spec module per architecture, registered in ``registry.DRAFTERS``.

Torch-free and at the bottom of the import graph (the CLI, ``DrafterConfig``, convert, the exporters
and the study read it). See :mod:`osprey_train.drafters.registry` and docs/models.md, "Adding a drafter".
"""

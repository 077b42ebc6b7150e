"""Data of Stage 4 (distill): packing store samples into document-masked token budgets.

See :mod:`osprey_train.distill_data.packing`.
"""

__all__: list[str] = []

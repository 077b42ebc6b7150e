"""Evaluation: offline acceptance length, cross-domain matrices, chain drafting, live decoding.

Kept free of heavy imports: import the submodules (``acceptance``, ``matrix``, ``chain_draft``,
``spec_decode``, ``live`` ...) directly.
"""

__all__: list[str] = []

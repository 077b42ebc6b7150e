"""The DFlash block drafter: one forward drafts a block, reading the target's taps as keys and values.

Everything of the architecture is in this folder: ``arch.py`` (its registry entry, torch-free),
``model.py`` (the ``nn.Module``, vLLM's ``DFlashDraftModel``), ``convert.py`` (Stage 3: random
Qwen3 layers, the target's embedding and head), ``objective.py`` (block training on a store's
response tokens), ``drafting.py`` (offline drafts and the live session) and ``export.py`` (the
vLLM layout and its read-back).
"""

"""The EAGLE-3 baseline: one Llama layer reading [embedding; fused taps], shaped like the target.

Everything of the architecture is in this folder: ``arch.py`` (its registry entry, torch-free),
``model.py`` (the ``nn.Module``), ``convert.py`` (Stage 3: random body, the target's embedding,
the store's draft vocabulary) and ``export.py`` (the vLLM speculators layout, the SGLang read-back).
Its training objective, offline drafts and live session are the shared autoregressive chain ones
(the defaults of :class:`~osprey_train.drafters.spec.DrafterSpec`).
"""

"""The Osprey drafter: N pruned, pre-trained source-family layers, the target's taps in every layer.

Everything of the architecture is in this folder: ``arch.py`` (its registry entry, torch-free),
``model.py`` (the ``nn.Module``), ``convert.py`` (Stage 3 from a pre-trained backbone),
``export.py`` (the vLLM layout and the SGLang read-back), ``vllm_model.py`` (the model class vLLM
serves it with, registered through this package's vLLM plugin) and ``sglang/`` (the external model
class SGLang loads through ``SGLANG_EXTERNAL_MODEL_PACKAGE``). Its training objective, offline drafts
and live session are the shared autoregressive chain ones (the defaults of
:class:`~osprey_train.drafters.spec.DrafterSpec`).
"""

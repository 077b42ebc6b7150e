"""Training-Time Test (EAGLE-3) machinery: TTT attention, chunked distillation loss, the unroll.

Submodules: ``attention`` (TTTAttention, flex/sdpa/eager/naive), ``loss`` (chunked LM head + CE
against top-k or full-vocabulary targets), ``target_head`` (the target's LM head from
safetensors), ``unroll`` (K-step unroll and loss). Import them directly.
"""

__all__: list[str] = []

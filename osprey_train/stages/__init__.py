"""Training stages of the Osprey recipe (prune, pretrain, convert, distill), one file per stage.

Kept free of imports on purpose: each stage pulls in torch/transformers only when used, and
several helpers add files to this folder independently.
"""

__all__: list[str] = []

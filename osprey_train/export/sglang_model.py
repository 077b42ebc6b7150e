"""Where SGLang found the Osprey drafter's external class before it moved into its arch folder.

Osprey SGLang exports written before the class moved to ``osprey_train/drafters/osprey/sglang/``
name ``SGLANG_EXTERNAL_MODEL_PACKAGE=osprey_train.export`` in their serving.json and README. SGLang
imports every module of that package and collects their ``EntryClass``: this module hands it the
same class, so those exports keep serving without a re-export. New exports name the new package.
"""

from __future__ import annotations

from osprey_train.drafters.osprey.sglang import model as _model

__all__ = []

if hasattr(_model, "EntryClass"):   # only where SGLang is installed (the class needs it)
    EntryClass = _model.EntryClass

"""Serving engines (vLLM) running Osprey's exports for real, each in a virtual environment of its own.

An engine pins its own torch and transformers, so it never runs in this package's environment:
:mod:`rig` finds its venv (``engines/setup_vllm.sh`` makes it), :mod:`vllm_driver` is the script
that runs inside it (the model classes an architecture needs in an engine live in its folder,
e.g. :mod:`osprey_train.drafters.osprey.vllm_model`),
and :mod:`compare` sets the engine's own counters beside Osprey's offline and live figures
(``osprey eval engine``).
"""

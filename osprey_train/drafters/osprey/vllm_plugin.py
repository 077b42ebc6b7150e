"""vLLM plugin: registers the Osprey drafter's model class with vLLM (entry point ``vllm.general_plugins``).

``pyproject.toml`` declares ``[project.entry-points."vllm.general_plugins"] osprey =
"osprey_train.drafters.osprey.vllm_plugin:register"``; vLLM calls every function of that group in each of
its processes before it resolves a model architecture, so once this package is installed next to
vLLM, ``osprey export --format vllm`` of an Osprey drafter (``architectures:
[Eagle3OspreyForCausalLM]``) loads like any built-in draft model. The class is registered by its
``module:Class`` name, so nothing of it is imported until vLLM builds the draft model. vLLM's
EAGLE-3 config keeps an architecture whose name starts with ``Eagle3`` as it is, hence the name.

The weight-name mapping lives here, in plain Python, so it is tested without vLLM. This module
and the class import nothing of this package beyond themselves: the vLLM venv holds vLLM's
dependencies, not ours (no zarr, no pyarrow), and vLLM imports plugins in every process.
"""

from __future__ import annotations

__all__ = ["register", "vllm_weight_name", "OSPREY_VLLM_ARCH", "OSPREY_VLLM_CLASS"]

OSPREY_VLLM_ARCH = "Eagle3OspreyForCausalLM"
OSPREY_VLLM_CLASS = "osprey_train.drafters.osprey.vllm_model:Eagle3OspreyForCausalLM"
# (our tensor-name fragment, vLLM's fused parameter fragment, shard id)
_FUSED = ((".self_attn.q_proj.", ".self_attn.qkv_proj.", "q"), (".self_attn.k_proj.", ".self_attn.qkv_proj.", "k"),
          (".self_attn.v_proj.", ".self_attn.qkv_proj.", "v"), (".mlp.gate_proj.", ".mlp.gate_up_proj.", 0),
          (".mlp.up_proj.", ".mlp.gate_up_proj.", 1))


def register() -> None:
    """Register the Osprey drafter's vLLM class (idempotent: vLLM may call plugins more than once)."""
    from vllm import ModelRegistry

    if OSPREY_VLLM_ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(OSPREY_VLLM_ARCH, OSPREY_VLLM_CLASS)


def vllm_weight_name(name: str) -> tuple[str | None, object]:
    """Exported tensor name -> (vLLM parameter name, shard id or None); ``(None, None)`` to skip.

    q/k/v and gate/up fuse into vLLM's ``qkv_proj`` / ``gate_up_proj`` shards; ``d2t`` (offsets)
    is vLLM's ``draft_id_to_target_id``; ``t2d`` is not used by vLLM.
    """
    if name == "t2d":
        return None, None
    if name == "d2t":
        return "draft_id_to_target_id", None
    for ours, fused, shard in _FUSED:
        if ours in name:
            return name.replace(ours, fused), shard
    return name, None

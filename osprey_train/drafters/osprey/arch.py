"""Registry entry of the Osprey drafter: N source-family decoder layers, the target's condition in every layer.

Torch-free (read by the CLI, configs and the study). Its code is in this folder: ``model.py``,
``convert.py`` (Stage 3), ``export.py`` (the vLLM layout, the SGLang read-back), ``vllm_model.py``
and ``vllm_plugin.py`` (vLLM's model class for it), ``sglang/model.py`` (SGLang's external class).
"""

from __future__ import annotations

from typing import Any

from osprey_data.errors import ConfigError
from osprey_train.drafters.spec import DrafterSpec

__all__ = ["SPEC", "SGLANG_ARCHITECTURE", "SGLANG_PACKAGE", "VLLM_ARCHITECTURE", "VLLM_FAMILIES", "W_C_INITS",
           "w_c_init_of"]

SGLANG_ARCHITECTURE = "OspreyDrafterForCausalLM"
"""The external SGLang model class shipped in ``osprey_train/drafters/osprey/sglang/model.py``."""
SGLANG_PACKAGE = "osprey_train.drafters.osprey.sglang"
"""``SGLANG_EXTERNAL_MODEL_PACKAGE``: the package holding that class (and nothing else)."""
VLLM_ARCHITECTURE = "Eagle3OspreyForCausalLM"
"""``architectures[0]`` of its vLLM export; registered with vLLM by ``vllm_plugin.py`` (vLLM keeps
names starting with Eagle3 as they are)."""


def _check_convert(config: Any) -> None:
    if config.backbone is None:
        raise ConfigError("convert: --backbone is required for --arch osprey")
    if config.target is None and config.store is None:
        raise ConfigError("convert: pass --target MODEL or --store STORE (or both)")
    if config.eagle3_layers != 1:
        raise ConfigError("convert: --eagle3-layers applies to --arch eagle3 only (an Osprey drafter has the "
                          "backbone's layers)")


W_C_INITS = ("random", "identity")
"""``arch_options.w_c_init``: W_c drawn at random (the default, :func:`init_w_c`), or the identity on
the deepest tap (the authors' public release; zero on the other taps, the leading ``min(D, Dt)``
dimensions when the drafter and the target differ in width)."""


def w_c_init_of(config: Any) -> str:
    """How W_c was initialised (``random`` when the config does not say)."""
    return str(config.arch_options.get("w_c_init", W_C_INITS[0]))


def _check_config(config: Any) -> None:
    unknown = sorted(set(config.arch_options) - {"w_c_init"})
    if unknown:
        raise ConfigError(f"drafter config: the osprey drafter's arch_options has unknown key(s) {unknown}; "
                          "known: ['w_c_init']")
    if w_c_init_of(config) not in W_C_INITS:
        raise ConfigError(f"drafter config: osprey w_c_init must be one of {list(W_C_INITS)}, got "
                          f"{config.arch_options['w_c_init']!r}")


VLLM_FAMILIES = ("llama", "qwen2")
"""Backbone families the Osprey vLLM model class (``vllm_model.py``) implements."""


def _check_export(config: Any, fmt: str) -> None:
    # vLLM has no class of its own for N layers conditioned on the target in every layer: this
    # package registers one through vLLM's plugin entry point, for these families
    if fmt == "vllm" and config.family not in VLLM_FAMILIES:
        raise ConfigError(f"export --format vllm: the Osprey drafter's vLLM class serves the {VLLM_FAMILIES} "
                          f"families; this drafter is {config.family!r} (q/k norms are not implemented there); "
                          "use --format sglang or --format hf")


def _sglang_fields(config: Any) -> dict[str, Any]:
    # The external class rebuilds the drafter from its own config.
    return {"osprey_drafter": config.to_dict()}


SPEC = DrafterSpec(
    name="osprey",
    listing_order=0,
    summary="convert a pre-trained backbone (N layers, the target's taps conditioning every layer)",
    model_class="osprey_train.drafters.osprey.model:OspreyDrafter",
    convert="osprey_train.drafters.osprey.convert:convert_osprey",
    needs_backbone=True,
    default_draft_vocab=None,
    study_layer_cost=0.75,
    tiny={},
    arch_option_keys=("w_c_init",),
    check_config=_check_config,
    check_convert=_check_convert,
    check_export=_check_export,
    vllm_writer="osprey_train.drafters.osprey.export:write_osprey_vllm",
    sglang_architecture=SGLANG_ARCHITECTURE,
    sglang_fields=_sglang_fields,
    vllm_reader="osprey_train.drafters.osprey.export:read_osprey_vllm",
    sglang_reader="osprey_train.drafters.osprey.export:osprey_config_from_sglang",
    serving_label="Osprey drafter (external class)",
    serving_env={"SGLANG_EXTERNAL_MODEL_PACKAGE": SGLANG_PACKAGE},
    # `osprey` on PyPI is an unrelated project: the Osprey package is installed from its repository.
    serving_install=(f"# the external model class {SGLANG_ARCHITECTURE} ships with Osprey itself, which is not on "
                     "PyPI\n# (the `osprey` package there is another project): from a clone of the Osprey "
                     "repository,\npip install -e \".[sglang]\""),
)

"""Registry entry of the Osprey drafter: N source-family decoder layers, the target's condition in every layer.

Torch-free (read by the CLI, configs and the study). Its code: :mod:`osprey_train.models.osprey`
(model), :func:`osprey_train.stages.convert.convert_osprey` (Stage 3), the SGLang external class
in :mod:`osprey_train.export.sglang_model` and :func:`osprey_train.export.sglang.osprey_config_from_sglang`.
"""

from __future__ import annotations

from typing import Any

from osprey_data.errors import ConfigError
from osprey_train.drafters.spec import DrafterSpec

__all__ = ["SPEC", "SGLANG_ARCHITECTURE"]

SGLANG_ARCHITECTURE = "OspreyDrafterForCausalLM"
"""The external SGLang model class shipped in ``osprey_train/export/sglang_model.py``."""


def _check_convert(config: Any) -> None:
    if config.backbone is None:
        raise ConfigError("convert: --backbone is required for --arch osprey")
    if config.target is None and config.store is None:
        raise ConfigError("convert: pass --target MODEL or --store STORE (or both)")
    if config.eagle3_layers != 1:
        raise ConfigError("convert: --eagle3-layers applies to --arch eagle3 only (an Osprey drafter has the "
                          "backbone's layers)")


def _check_export(config: Any, fmt: str) -> None:
    if fmt == "vllm":
        raise ConfigError("export: vLLM has no model class for the Osprey drafter (N layers conditioned on the "
                          "target in every layer); use --format sglang (with the shipped external model class) "
                          "or --format hf")


def _sglang_fields(config: Any) -> dict[str, Any]:
    # The external class rebuilds the drafter from its own config.
    return {"osprey_drafter": config.to_dict()}


SPEC = DrafterSpec(
    name="osprey",
    summary="convert a pre-trained backbone (N layers, the target's taps conditioning every layer)",
    model_class="osprey_train.models.osprey:OspreyDrafter",
    convert="osprey_train.stages.convert:convert_osprey",
    needs_backbone=True,
    default_draft_vocab=None,
    study_layer_cost=0.75,
    tiny={},
    check_convert=_check_convert,
    check_export=_check_export,
    sglang_architecture=SGLANG_ARCHITECTURE,
    sglang_fields=_sglang_fields,
    sglang_reader="osprey_train.export.sglang:osprey_config_from_sglang",
    serving_label="Osprey drafter (external class)",
    serving_env={"SGLANG_EXTERNAL_MODEL_PACKAGE": "osprey_train.export"},
    # `osprey` on PyPI is an unrelated project: the Osprey package is installed from its repository.
    serving_install=(f"# the external model class {SGLANG_ARCHITECTURE} ships with Osprey itself, which is not on "
                     "PyPI\n# (the `osprey` package there is another project): from a clone of the Osprey "
                     "repository,\npip install -e \".[sglang]\""),
)

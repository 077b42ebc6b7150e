"""Checks of an evaluation that need only config files, run before any model's weights load.

A drafter's ``config.json`` states the target it was converted for (vocabulary, hidden width,
tap layers), and a target's ``config.json`` states its sizes: comparing them costs milliseconds,
loading the two models seconds to minutes. Each helper here reads the drafter's config with
:func:`~osprey_train.models.io.read_drafter_config` and applies the same check the commands
apply after loading (:func:`~osprey_data.target_model.check_compatible`), so the rule lives in
one place. The target's config and tokenizer hashes need the loaded target; they are still
checked after loading.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from osprey_data.conversation import InputSample
from osprey_data.store import StoreReader
from osprey_data.target_model import check_chat_template, check_compatible, check_fits_target_config
from osprey_train.evaluation.live_prompts import check_prompt_sample
from osprey_train.models.config import DrafterConfig
from osprey_train.models.io import read_drafter_config

__all__ = ["check_drafter_on_target", "check_drafter_on_store", "check_live_prompts"]


def check_drafter_on_target(drafter: str | Path, target: str, gguf_file: str | None = None, *, command: str,
                            hint: str = "use the drafter's own target") -> DrafterConfig:
    """The drafter's config, checked to fit ``target``'s config.json (vocabulary, hidden width, taps).

    Raises:
        CheckpointError: ``drafter`` has no readable drafter config.json.
        ModelError: the sizes differ; the message names both config files.
    """
    config = read_drafter_config(drafter)
    check_fits_target_config(config, target, gguf_file,
                             where=f"{command}: --drafter {Path(drafter) / 'config.json'} on --target {target}",
                             hint=hint)
    return config


def check_drafter_on_store(drafter: str | Path, reader: StoreReader, *, where: str) -> DrafterConfig:
    """The drafter's config, checked against a store's header as the loaded drafter would be."""
    config = read_drafter_config(drafter)
    check_compatible(config, reader.header.target, taps=reader.header.taps,
                     where=f"{where} ({Path(drafter) / 'config.json'})")
    return config


def check_live_prompts(samples: Iterable[InputSample], target: str, gguf_file: str | None,
                       chat_template: str | None) -> None:
    """Every sample can be a prompt, and the target's tokenizer files carry a chat template to
    render them with (unless ``--chat-template`` gives one)."""
    for sample in samples:
        check_prompt_sample(sample)
    if chat_template is None:
        check_chat_template(target, gguf_file)

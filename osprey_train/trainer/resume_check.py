"""Refuse a resume whose options make the checkpoint foreign, naming the option and both values.

A stage records its whole config in the trainer state (``extra.config``, see
:func:`~osprey_train.trainer.config.config_json`). On ``--resume`` every option of the stage
config is compared with the recorded one, except those marked ``operational`` (a checkpoint
period, a prefetch depth, the device: they do not change what is trained), the memory knobs of
:data:`RESUME_FREE` (``--loss-chunk``) and the run folder itself. Another ``--store``, ``--ttt-steps`` or ``--target-dist`` would continue a checkpoint
trained on other data or with another loss; that is refused before any model is built. (A
checkpoint beyond ``--steps`` is refused by ``loop.check_resume_request``.)

Options the recorded config does not have (written by an older version) are not compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from osprey_data.config_fields import config_fields
from osprey_data.errors import CheckpointError
from osprey_train.trainer.checkpoint import latest_checkpoint, read_trainer_state
from osprey_train.trainer.config import config_json

__all__ = ["check_resume_config", "RESUME_FREE"]

_MISSING = object()
_NOT_COMPARED = ("out_dir", "extra")   # the folder being resumed; free-form run description
RESUME_FREE = {
    "loss_chunk": "rows per LM-head/loss chunk: how many logits are held at once, not what they are",
}
"""Options that are part of a stage's identity (a study keeps them in its stage keys, so finished
stages keep their keys) but not of a resume's: they bound memory and do not change the loss or its
gradient (beyond float rounding of a different grouping), so a checkpoint may continue under
another value. Every ``operational`` option is free as well (device, periods, prefetch, threads,
gradient checkpointing, ...)."""


def _lookup(doc: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(doc, dict) or name not in doc:
            return _MISSING
        doc = doc[name]
    return doc


def _same(saved: Any, now: Any) -> bool:
    if saved == now:
        return True
    # the same local folder spelled differently (relative vs absolute)
    if isinstance(saved, str) and isinstance(now, str) and "://" not in saved + now:
        return Path(saved).resolve() == Path(now).resolve()
    return False


def check_resume_config(cfg: Any) -> None:
    """CheckpointError if resuming ``cfg.loop.out_dir`` with ``cfg`` would continue a foreign
    checkpoint; nothing when the run is not resuming or has no checkpoint yet."""
    loop = cfg.loop
    ckpt = latest_checkpoint(loop.out_dir / "checkpoints")
    if not loop.resuming or ckpt is None:
        return
    doc = read_trainer_state(ckpt)
    saved_cfg = (doc.get("extra") or {}).get("config")
    if not isinstance(saved_cfg, dict):
        return
    now_cfg = config_json(cfg)
    diffs = []
    for c in config_fields(type(cfg)):
        if c.metadata.get("operational") or c.path[-1] in _NOT_COMPARED or c.path[-1] in RESUME_FREE:
            continue
        saved, now = _lookup(saved_cfg, c.path), _lookup(now_cfg, c.path)
        if saved is _MISSING or _same(saved, now):
            continue
        if c.metadata.get("negate"):   # a flag that turns the field off (--train-embeddings)
            diffs.append(f"{c.metadata['flag']}: checkpoint {not saved!r}, now {not now!r}")
        else:
            diffs.append(f"{c.flag}: checkpoint {saved!r}, now {now!r}")
    if diffs:
        raise CheckpointError(f"{ckpt}: cannot resume, the checkpoint was trained with other settings "
                              f"({'; '.join(diffs)}); resume with the original options or start a fresh --out")

"""Stable names for the demo's outputs: ``OUT/drafter``, ``OUT/stores/train``, ``OUT/stores/eval``.

The study runner keeps every finished stage under a folder named by its settings hash
(``OUT/work/stages/distill-<hash>/run/final``): right for reuse, useless to type. The demo
publishes its distilled drafter and its two stores under fixed names as **relative symbolic
links** into ``OUT/work/stages/``:

- links, not copies: a store can be large, and a copy could drift from the stage it came from;
  a link always names the finished output of this run's settings;
- relative: moving or copying the whole ``OUT`` folder keeps them valid;
- replaced atomically: each link is made under a temporary name in the same folder and renamed
  over the old one (``os.replace``), so a rerun with other settings never leaves a moment with no
  ``OUT/drafter`` or a half-made one;
- a real file or folder at one of these names is the user's own and is never replaced: that is
  an error naming it.

``demo.json`` ``paths`` lists the stable names and ``resolved`` the stage folders they point at.
"""

from __future__ import annotations

import os
from pathlib import Path

from osprey_data.errors import ConfigError

__all__ = ["STABLE_NAMES", "publish_outputs"]

STABLE_NAMES = {"drafter": "drafter", "train_store": "stores/train", "eval_store": "stores/eval",
                "train_prompts": "prompts/train.jsonl", "eval_prompts": "prompts/eval.jsonl"}
"""Output role -> its path under the demo's ``--out`` folder."""


def publish_outputs(out: Path, targets: dict[str, Path]) -> dict[str, Path]:
    """Point ``out/STABLE_NAMES[role]`` at ``targets[role]`` (each inside ``out``) as relative links;
    returns role -> link path. Each link is checked before any is replaced."""
    out = Path(out)
    plan = []
    for role, target in targets.items():
        link = out / STABLE_NAMES[role]
        if (link.exists() or link.is_symlink()) and not link.is_symlink():
            raise ConfigError(f"demo: {link} exists and is not the demo's link; move it away (the demo publishes "
                              f"its {role.replace('_', ' ')} there) and rerun")
        if not Path(target).exists():
            raise AssertionError(f"demo output {target} missing after a finished study")   # internal invariant
        plan.append((role, link, os.path.relpath(Path(target).resolve(), link.parent.resolve())))
    made = {}
    for role, link, relative in plan:
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.symlink(relative, tmp, target_is_directory=Path(target).is_dir())
        os.replace(tmp, link)   # atomic: the old link, or the new one, never neither
        made[role] = link
    return made

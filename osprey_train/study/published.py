"""Names a run will publish as links into its folder, checked before its first stage.

The demo publishes its distilled drafter, stores and prompt files as relative links under stable
names (``OUT/drafter``, ``OUT/stores/train``, ...; ``osprey_train/demo/outputs.py``), but only once
every stage has finished, and a real file or folder at one of those names is the user's own and is
never replaced. Found only then, it is refused after the whole run (issue #45). :func:`check_publishable`
makes the same refusal up front: call it with the same names before the first stage runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from osprey_data.errors import ConfigError

__all__ = ["check_publishable"]


def check_publishable(out: str | Path, names: Mapping[str, str], what: str = "demo") -> None:
    """Refuse (:class:`ConfigError`) a run whose ``out/names[role]`` is a file or folder of the user's
    (not a link the run made), or lies below something that is not a plain folder.

    Args:
        out: the run's output folder (it may not exist yet).
        names: role -> path relative to ``out`` that the run will publish as a link.
        what: the command, for the message.
    """
    out = Path(out)
    for role, rel in names.items():
        link = out / rel
        for parent in reversed(Path(rel).parents[:-1]):   # the folders between out and the link
            folder = out / parent
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise ConfigError(f"{what}: {folder} is not a plain folder, so the {what} cannot publish its "
                                  f"{role.replace('_', ' ')} at {link}; move it away and rerun")
        if link.exists() and not link.is_symlink():
            raise ConfigError(f"{what}: {link} exists and is not the {what}'s link; move it away (the {what} "
                              f"publishes its {role.replace('_', ' ')} there) and rerun")

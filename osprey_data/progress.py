"""One switch for the progress bars a command does not draw itself.

``--no-progress`` turns off Osprey's own tqdm bars through each config's ``progress`` field; the
bars of the libraries underneath (transformers' ``Loading weights`` and ``Writing model shards``,
huggingface_hub's downloads) and the bars of code reached without that field (the vocabulary
alignment of ``train convert`` inside a study) follow :func:`progress_bars` instead: off inside
the block, as they were after it. :func:`bars_enabled` is what Osprey's own bars consult.

Importing this module does not import transformers: it is switched only when a block turns bars
off, and only if installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["progress_bars", "bars_enabled"]

_off = 0   # nesting depth of progress_bars(False) blocks


def bars_enabled() -> bool:
    """False inside a :func:`progress_bars` ``(False)`` block."""
    return _off == 0


@contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """Within the block, no progress bar when ``enabled`` is False (nothing changes when True)."""
    global _off
    if enabled:
        yield
        return
    restore = []
    if importlib.util.find_spec("transformers") is not None:
        from transformers.utils import logging as hf_logging

        if hf_logging.is_progress_bar_enabled():   # huggingface_hub's bars (downloads) go with them
            hf_logging.disable_progress_bar()
            restore.append(hf_logging.enable_progress_bar)
    _off += 1
    try:
        yield
    finally:
        _off -= 1
        for undo in restore:
            undo()

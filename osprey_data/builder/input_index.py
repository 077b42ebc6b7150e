"""This worker's input samples, held compactly and read again in batches as the build needs them.

The builder used to keep every input record as a Python object (conversation dicts, strings,
the dataclass) for the whole build: 10^6 tiny prompts took several times the memory their text
needs. Now the inputs are read twice:

1. :func:`index_inputs`, before any model loads: every record is parsed and checked (a malformed
   line still fails first), and only what resume and the progress bar need is kept per sample
   of this worker: its id, its file (an index into a short list) and its line, in compact arrays.
   Skipped records go into a :class:`~osprey_data.store.skip_log.SkipLog` (runs, not dicts).
2. :func:`stream_batches`, during the build: the same inputs read again, in the same order, with
   the same limit and partition, yielding this worker's samples in batches of ``batch_size``:
   exactly the slices of the old in-memory list, so resume recomputes identical batches. A record
   whose id differs from the first pass (a file edited during the build) stops the build with
   one line naming it.

Reading twice costs a second parse of the inputs, small next to generating with the target.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from osprey_data.builder.config import BuildConfig
from osprey_data.builder.partition import belongs_to
from osprey_data.conversation import InputSample, iter_inputs
from osprey_data.errors import InputError
from osprey_data.store.skip_log import SkipLog

__all__ = ["InputIndex", "index_inputs", "stream_batches"]


@dataclass
class InputIndex:
    """This worker's samples in input order: ids, files (indices into ``files``) and lines."""

    ids: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    file_of: array = field(default_factory=lambda: array("I"))
    lines: array = field(default_factory=lambda: array("q"))
    errors: SkipLog = field(default_factory=SkipLog)
    """This worker's malformed input records (``--on-error skip``)."""
    has_conversations: bool = False
    """Some sample is a conversation (rendered with the chat template), not pre-formatted text."""

    def __len__(self) -> int:
        return len(self.ids)

    def where(self, k: int) -> tuple[str, int]:
        """(file, line) of the k-th sample."""
        return self.files[self.file_of[k]], self.lines[k]

    def append(self, sample: InputSample) -> None:
        if not self.files or self.files[-1] != sample.file:
            if sample.file not in self.files:
                self.files.append(sample.file)
            self.file_of.append(self.files.index(sample.file))
        else:
            self.file_of.append(len(self.files) - 1)
        self.ids.append(sample.sample_id)
        self.lines.append(sample.line)
        self.has_conversations = self.has_conversations or not sample.is_text


def _mine(config: BuildConfig, errors: SkipLog | None) -> Iterator[InputSample]:
    """This worker's samples in input order (the limit counts every worker's samples)."""
    def sink(sample_id: str | None, file: str | None, line: int | None, reason: str) -> None:
        if errors is not None and belongs_to(f"{file}:{line}", config.worker_index, config.num_workers):
            errors.add(sample_id=sample_id, file=file, line=line, reason=f"input_error: {reason}")

    seen = 0
    for sample in iter_inputs(config.inputs, on_error=config.on_error, error_sink=sink):
        if config.limit is not None and seen >= config.limit:
            return
        seen += 1
        if belongs_to(sample.sample_id, config.worker_index, config.num_workers):
            yield sample


def index_inputs(config: BuildConfig) -> InputIndex:
    """Read and check every input; keep this worker's samples compactly (first pass)."""
    index = InputIndex()
    for sample in _mine(config, index.errors):
        index.append(sample)
    return index


def stream_batches(config: BuildConfig, index: InputIndex) -> Iterator[list[InputSample]]:
    """This worker's samples again, in batches of ``config.batch_size`` (second pass), each checked
    against the first pass."""
    batch: list[InputSample] = []
    k = 0
    for sample in _mine(config, None):
        if k >= len(index) or sample.sample_id != index.ids[k]:
            file, line = (sample.file, sample.line)
            raise InputError(f"{file}:{line}: the inputs changed while the build ran (record {k + 1} of this "
                             f"worker is now sample {sample.sample_id!r}); rerun on unchanging inputs "
                             "(finished samples are kept)")
        batch.append(sample)
        k += 1
        if len(batch) == config.batch_size:
            yield batch
            batch = []
    if k != len(index):
        file, line = index.where(k)
        raise InputError(f"{file}:{line}: the inputs changed while the build ran (sample {index.ids[k]!r} is no "
                         "longer there); rerun on unchanging inputs (finished samples are kept)")
    if batch:
        yield batch

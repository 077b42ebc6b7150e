"""``osprey data show``: one stored sample's text with its loss mask marked.

The store keeps token ids and the loss mask, not text: the sample is decoded with the store's
target tokenizer (the header's ``target.name_or_path``, or ``--tokenizer``, which must hash as the
header's ``tokenizer_hash``) in runs of equal mask value, so each run's text is exactly what the
drafter is trained on (loss) or only conditioned on (no loss). Only the sample's table row is read
(token ids, mask, metadata): no hidden state is decoded.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from osprey_data.errors import ConfigError, InputError, StoreCorruptError
from osprey_data.store.reader import StoreReader
from osprey_data.target_model import split_gguf, tokenizer_hash
from osprey_data.text import printable, printable_text

__all__ = ["ShowConfig", "ShownSample", "Span", "run", "loss_spans", "COLOR_MODES"]

COLOR_MODES = ("auto", "always", "never")
LOSS_OPEN, LOSS_CLOSE = "[[", "]]"
_DIM, _BOLD, _RESET = "\x1b[2m", "\x1b[1m", "\x1b[0m"


@dataclass(kw_only=True)
class ShowConfig:
    """Options of ``osprey data show``."""

    store: str
    """Store path or fsspec URL."""
    sample: str = "0"
    """The sample: its index in the store (0-based; negative counts from the end) or its sample id."""
    tokenizer: str | None = None
    """Tokenizer folder to decode with (default: the store's target, its header's ``target.name_or_path``)."""
    as_json: bool = field(default=False, metadata={"option": "json"})
    """Print the sample as JSON: its metadata and the spans of equal loss mask."""
    color: str = field(default="auto", metadata={"choices": COLOR_MODES})
    """Mark the loss mask with colour (trained text bold, the rest dimmed) instead of [[ ]] around the
    trained text: auto = on a terminal."""

    def __post_init__(self) -> None:
        if not self.store:
            raise ConfigError("show: --store must be a path or URL")
        self.sample = str(self.sample).strip()
        if not self.sample:
            raise ConfigError("show: --sample must be an index or a sample id")
        if self.color not in COLOR_MODES:
            raise ConfigError(f"show: --color must be one of {COLOR_MODES}, got {self.color!r}")


@dataclass
class Span:
    """A run of tokens with one loss-mask value."""

    loss: bool
    """True: the drafter is trained to predict these tokens."""
    num_tokens: int
    text: str


@dataclass
class ShownSample:
    """One stored sample, decoded."""

    store: str
    index: int
    sample_id: str
    domain: str
    source: str
    finish_reason: str
    num_tokens: int
    loss_tokens: int
    prompt_length: int
    spans: list[Span]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def to_text(self, *, color: bool = False) -> str:
        """A header line, a legend, then the text with the loss mask marked."""
        head = (f"sample {self.index} {printable(self.sample_id)!s} of {printable(self.store)} (domain "
                f"{printable(self.domain)}, {self.num_tokens} tokens, {self.loss_tokens} in the loss, finish "
                f"{printable(self.finish_reason)})")
        legend = ("loss mask: bold = trained on, dimmed = context only" if color else
                  f"loss mask: text inside {LOSS_OPEN} {LOSS_CLOSE} is trained on; the rest is context only")
        body = []
        for span in self.spans:
            text = printable_text(span.text)   # a stored sample must not drive the terminal
            if color:
                body.append(f"{_BOLD if span.loss else _DIM}{text}{_RESET}")
            else:
                body.append(f"{LOSS_OPEN}{text}{LOSS_CLOSE}" if span.loss else text)
        return f"{head}\n{legend}\n\n{''.join(body)}\n"


def loss_spans(token_ids: Any, loss_mask: Any, decode: Any) -> list[Span]:
    """Runs of equal mask value, each decoded with ``decode(list_of_ids) -> str``."""
    ids = np.asarray(token_ids).tolist()
    mask = np.asarray(loss_mask, dtype=bool).tolist()
    spans: list[Span] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            spans.append(Span(loss=bool(mask[start]), num_tokens=i - start, text=decode(ids[start:i])))
            start = i
    return spans


def _load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    folder, gguf = split_gguf(name_or_path, None)
    try:
        return AutoTokenizer.from_pretrained(folder, **({"gguf_file": gguf} if gguf else {}))
    except Exception as exc:  # transformers raises OSError/ValueError/... depending on what is missing
        raise InputError(f"{name_or_path}: cannot load a tokenizer ({type(exc).__name__}: {exc}); pass "
                         "--tokenizer FOLDER with the store target's tokenizer") from None


def _index(reader: StoreReader, sample: str) -> int:
    try:
        i = int(sample)
    except ValueError:
        return reader.index_of(sample)
    n = reader.num_samples
    if not -n <= i < n:
        raise ConfigError(f"show: --sample {i} is out of range: the store {reader.url} holds {n} samples "
                          f"(0..{n - 1})")
    return i % n


def run(config: ShowConfig) -> ShownSample:
    """Read sample ``config.sample`` of ``config.store`` and decode it in loss-mask runs."""
    reader = StoreReader(config.store)
    i = _index(reader, config.sample)
    k, row = reader.locate(i)
    rec = reader.shard(k).row(row)
    if not len(rec["token_ids"]) == len(rec["loss_mask"]) == int(rec["num_tokens"]):
        raise StoreCorruptError(f"sample {i} ({rec['sample_id']!r}) of {reader.url}: its token ids, loss mask and "
                                f"num_tokens={rec['num_tokens']} disagree in length")
    target = reader.header.target
    tokenizer = _load_tokenizer(config.tokenizer or target.name_or_path)
    if tokenizer_hash(tokenizer) != target.tokenizer_hash:
        raise ConfigError(f"show: the tokenizer of {config.tokenizer or target.name_or_path!r} is not the store's "
                          f"(its tokenizer_hash differs from the header's); pass --tokenizer with the store "
                          f"target's tokenizer")

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    mask = np.asarray(rec["loss_mask"], dtype=bool)
    return ShownSample(store=reader.url, index=i, sample_id=rec["sample_id"], domain=rec["domain"],
                       source=rec["source"], finish_reason=rec["finish_reason"], num_tokens=int(rec["num_tokens"]),
                       loss_tokens=int(mask.sum()), prompt_length=int(rec["prompt_length"]),
                       spans=loss_spans(rec["token_ids"], mask, decode))

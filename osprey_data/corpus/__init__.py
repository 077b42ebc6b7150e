"""Tokenized pretraining corpora: text/JSONL/Parquet/datasets -> uint32 shards, memory-mapped reads.

``tokenize`` writes a corpus folder (resumable, ``index.json`` last); ``reader`` maps it back as
one token stream and cuts seeded fixed-length windows; ``sources`` reads the input formats.
"""

from __future__ import annotations

from osprey_data.corpus.reader import TokenCorpus, WindowSampler
from osprey_data.corpus.sources import SOURCES, detect_format
from osprey_data.corpus.tokenize import TokenizeCorpusConfig, load_tokenizer, run, tokenizer_identity

__all__ = ["TokenizeCorpusConfig", "run", "TokenCorpus", "WindowSampler", "tokenizer_identity", "load_tokenizer",
           "SOURCES", "detect_format"]

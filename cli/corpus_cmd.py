"""``osprey data tokenize-corpus``: text/JSONL/Parquet/datasets -> uint32 token shards for Stage 2."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["tokenize_corpus"]


@click.command("tokenize-corpus")
@click.option("--tokenizer", required=True, help="Tokenizer or model folder (the backbone you will pretrain).")
@click.option("--input", "inputs", required=True, multiple=True, type=click.Path(path_type=Path),
              help="Corpus file (.txt, .jsonl, .parquet) or `datasets` folder; repeat for several.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output corpus folder.")
@click.option("--text-field", default="text", show_default=True, help="JSONL field / Parquet column with the text.")
@click.option("--txt-docs", type=click.Choice(["file", "paragraph", "line"]), default="file", show_default=True,
              help="How .txt files split into documents.")
@click.option("--shard-tokens", type=int, default=1 << 24, show_default=True, help="Tokens per shard (at least).")
@click.option("--batch-docs", type=int, default=256, show_default=True, help="Documents per tokenizer call.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def tokenize_corpus(tokenizer: str, inputs: tuple[Path, ...], out: Path, text_field: str, txt_docs: str,
                    shard_tokens: int, batch_docs: int, no_progress: bool) -> None:
    """Tokenize a text corpus into memory-mappable shards (resumable: rerun to continue).

    \b
    Example:
      osprey data tokenize-corpus --tokenizer runs/pruned --input corpus.jsonl --out corpora/generic
    """
    from osprey_data.corpus import TokenizeCorpusConfig, run

    index = run(TokenizeCorpusConfig(tokenizer=tokenizer, inputs=list(inputs), out_dir=out, text_field=text_field,
                                     txt_docs=txt_docs, shard_tokens=shard_tokens, batch_docs=batch_docs,
                                     progress=not no_progress))
    click.echo(f"{index['num_tokens']} tokens, {index['num_documents']} documents "
               f"({index['skipped_empty']} empty skipped) in {len(index['shards'])} shard(s) at {out}")

"""Vocabulary alignment: byte-level and SentencePiece surfaces, specials, averaging, row building."""

from __future__ import annotations

import pytest
import torch

from osprey_train.stages.vocab_align import (VocabAlignment, align_vocab, byte_level_decoder_map, detect_codec,
                                             token_surfaces)


def make_sentencepiece_tokenizer():
    """A tiny SentencePiece-style BPE (Metaspace ▁, <0xNN> byte fallback), built by hand."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    pieces = [f"<0x{b:02X}>" for b in range(256)]
    chars = list("abcdefghijklmnopqrstuvwxyzTH.,?") + ["▁"]
    merges = [("▁", "t"), ("▁t", "h"), ("▁th", "e"), ("▁", "c"), ("a", "t"), ("▁c", "at"), ("m", "at"),
              ("▁", "w"), ("▁w", "x"), ("q", "u"), ("qu", "u")]
    merged = ["".join(m) for m in merges]
    vocab = {tok: i for i, tok in enumerate(specials + pieces + chars + merged)}
    bpe = models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>")
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")


@pytest.fixture(scope="module")
def sp_tok():
    return make_sentencepiece_tokenizer()


def test_byte_level_alphabet_is_a_bijection():
    table = byte_level_decoder_map()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 32 and table["Ċ"] == 10 and table["ĉ"] == 9 and table["a"] == ord("a")


def test_codec_detection(sp_tok, tiny_tokenizer):
    assert detect_codec(sp_tok) == "sentencepiece"
    assert detect_codec(tiny_tokenizer) == "byte_level"
    surfaces, added = token_surfaces(sp_tok)
    vocab = sp_tok.get_vocab()
    assert surfaces[vocab["▁the"]] == b" the" and surfaces[vocab["<0x0A>"]] == b"\n"
    assert added[vocab["<eos>"]] == "<eos>"


def test_sentencepiece_target_on_byte_level_source(sp_tok, tiny_tokenizer):
    align = align_vocab(tiny_tokenizer, sp_tok)
    tv, sv = sp_tok.get_vocab(), tiny_tokenizer.get_vocab()
    # ▁ <-> Ġ and byte fallback <-> byte-level characters
    assert align.exact[tv["▁the"]] == sv["Ġthe"]
    assert align.exact[tv["<0x0A>"]] == sv["Ċ"]
    assert align.exact[tv["<0x20>"]] == sv["Ġ"]
    assert align.exact[tv["t"]] == sv["t"]
    # specials: known equivalents and roles
    assert align.exact[tv["<end_of_turn>"]] == sv["<|im_end|>"]
    assert align.exact[tv["<start_of_turn>"]] == sv["<|im_start|>"]
    assert align.exact[tv["<eos>"]] == sv["<|endoftext|>"]
    assert align.exact[tv["<pad>"]] == sv["<|endoftext|>"]  # role: pad
    # high bytes that are not UTF-8 on their own still map exactly to their byte-level character
    assert align.exact[tv["<0xE2>"]] == sv["â"]
    # a piece the source lacks as one token is averaged over a byte-exact source segmentation
    ids = align.averaged[tv["quu"]]
    surfaces, _ = token_surfaces(tiny_tokenizer)
    assert b"".join(surfaces[i] for i in ids) == b"quu"
    stats = align.stats()
    assert stats["exact"] + stats["averaged"] + stats["unmapped"] == len(sp_tok)
    assert stats["source_codec"] == "byte_level" and stats["target_codec"] == "sentencepiece"


def test_byte_level_target_on_sentencepiece_source(sp_tok, tiny_tokenizer):
    align = align_vocab(sp_tok, tiny_tokenizer, target_vocab_size=len(tiny_tokenizer) + 5)
    tv, sv = tiny_tokenizer.get_vocab(), sp_tok.get_vocab()
    assert align.exact[tv["Ġthe"]] == sv["▁the"]
    assert align.exact[tv["Ċ"]] == sv["<0x0A>"]
    assert align.exact[tv["<|im_end|>"]] == sv["<end_of_turn>"]
    assert align.padding_rows == 5 and set(range(len(tiny_tokenizer), len(tiny_tokenizer) + 5)) <= set(align.unmapped)
    # "Ġground" has no single source piece: averaged over a byte-exact cover ("▁", "g", "r", ...)
    surfaces, _ = token_surfaces(sp_tok)
    assert b"".join(surfaces[i] for i in align.averaged[tv["Ġground"]]) == b" ground"
    assert all(t in align.exact or t in align.averaged or t in align.unmapped for t in range(align.target_vocab_size))


def test_apply_builds_rows():
    align = VocabAlignment(target_vocab_size=4, source_vocab_size=3, exact={0: 2}, averaged={1: [0, 1]},
                           unmapped=[2, 3])
    rows = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 7.0]])
    out = align.apply(rows)
    torch.testing.assert_close(out, torch.tensor([[5.0, 7.0], [2.0, 1.0], [3.0, 3.0], [3.0, 3.0]]))

"""Vocabulary alignment (Stage 3): give every TARGET token an embedding / LM-head row of the source.

For each target token we compute the bytes it stands for (its "surface"), then:

1. exact    – a source token has the same surface: copy that row. Surfaces are decoded per
              tokenizer kind (``TOKEN_CODECS``): byte-level BPE pieces map characters back to
              bytes (``Ġ`` = space, ``Ċ`` = newline, ...), SentencePiece pieces turn ``▁`` into a
              space and ``<0xNN>`` into the byte NN. Special / added tokens match by content, then
              by known equivalents (``CHAT_MARKERS``: end-of-text, begin-of-text and chat-turn markers),
              then by role (bos, eos, pad, unk).
2. averaged – otherwise the mean of the rows of the source tokenization of the surface (the
              source tokenizer's own segmentation when it reproduces the bytes, else a greedy
              longest-match cover of the bytes by source surfaces; surfaces that are not valid
              UTF-8 on their own, e.g. half a multi-byte character, take the greedy cover).
3. unmapped – no source bytes cover it (or a padding row beyond the tokenizer): the mean of all
              source rows.

Legend: Vs source vocab, Vt target vocab, D hidden.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from osprey_data.errors import ModelError
from osprey_data.progress import bars_enabled

__all__ = ["VocabAlignment", "align_vocab", "align_backbone_embeddings", "token_surfaces", "detect_codec",
           "TOKEN_CODECS", "CHAT_MARKERS", "byte_level_decoder_map"]

# Groups of special tokens that play the same role in different tokenizers / chat templates.
CHAT_MARKERS: tuple[frozenset[str], ...] = (
    frozenset({"<|endoftext|>", "<eos>", "</s>", "<|end_of_text|>"}),
    frozenset({"<bos>", "<s>", "<|begin_of_text|>"}),
    frozenset({"<|im_start|>", "<start_of_turn>", "<|start_header_id|>", "<|im_sep|>"}),
    frozenset({"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"}),
)
_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")


@lru_cache(maxsize=1)
def byte_level_decoder_map() -> dict[str, int]:
    """GPT-2 byte-level alphabet: printable stand-in character -> byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _byte_level_surface(piece: str) -> bytes | None:
    table = byte_level_decoder_map()
    try:
        return bytes(table[ch] for ch in piece)
    except KeyError:
        return None  # not a byte-level piece (e.g. a raw added token)


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _sentencepiece_surface(piece: str) -> bytes | None:
    m = _BYTE_FALLBACK.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace("▁", " ").encode("utf-8")


# tokenizer kind -> piece -> surface bytes (None when the piece is not of that kind)
TOKEN_CODECS: dict[str, Callable[[str], bytes | None]] = {
    "byte_level": _byte_level_surface,
    "sentencepiece": _sentencepiece_surface,
}


def _decoder_types(node: Any) -> list[str]:
    if not isinstance(node, dict):
        return []
    types = [node.get("type", "")]
    for child in node.get("decoders", []) or []:
        types += _decoder_types(child)
    return types


def detect_codec(tokenizer: Any, *, where: str = "tokenizer") -> str:
    """'byte_level' or 'sentencepiece', from the fast tokenizer's decoder (vocab heuristics as backup)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        types = _decoder_types(json.loads(backend.to_str()).get("decoder"))
        if "ByteLevel" in types:
            return "byte_level"
        if "Metaspace" in types or "ByteFallback" in types or "Replace" in types:
            return "sentencepiece"
    vocab = tokenizer.get_vocab()
    sample = list(vocab)[:5000]
    if sum("▁" in t for t in sample) > len(sample) // 20:
        return "sentencepiece"
    if sum(t.startswith("Ġ") for t in sample) > len(sample) // 20:
        return "byte_level"
    raise ModelError(f"{where}: cannot tell whether it is byte-level BPE or SentencePiece; "
                     "vocabulary alignment supports those two kinds")


def _added_tokens(tokenizer: Any) -> dict[int, tuple[str, bool]]:
    """id -> (content, special) for added tokens (specials and user-added)."""
    out = {}
    for idx, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        out[int(idx)] = (str(tok.content), bool(getattr(tok, "special", True)))
    return out


def token_surfaces(tokenizer: Any, *, where: str = "tokenizer") -> tuple[dict[int, bytes], dict[int, str]]:
    """(surface bytes of every ordinary token by id, content of every added/special token by id)."""
    codec = TOKEN_CODECS[detect_codec(tokenizer, where=where)]
    added = _added_tokens(tokenizer)
    surfaces: dict[int, bytes] = {}
    for piece, idx in tokenizer.get_vocab().items():
        if idx in added:
            continue
        surface = codec(piece)
        if surface is not None and surface:
            surfaces[int(idx)] = surface
    return surfaces, {i: c for i, (c, _) in added.items()}


@dataclass
class VocabAlignment:
    """Where every target row comes from."""

    target_vocab_size: int
    source_vocab_size: int
    exact: dict[int, int] = field(default_factory=dict)
    """target id -> source id (row copied)."""
    averaged: dict[int, list[int]] = field(default_factory=dict)
    """target id -> source ids whose rows are averaged."""
    unmapped: list[int] = field(default_factory=list)
    """target ids with no source bytes (mean of all source rows)."""
    by_role: int = 0
    """How many exact mappings came from special-token roles / chat markers."""
    padding_rows: int = 0
    """Target rows beyond the target tokenizer's length (counted in unmapped)."""
    source_codec: str = ""
    target_codec: str = ""

    def apply(self, source_rows_VsD: torch.Tensor) -> torch.Tensor:
        """The (Vt, D) matrix for the target vocabulary built from a source (Vs, D) matrix."""
        rows = source_rows_VsD.detach()
        out = rows.mean(dim=0, keepdim=True).expand(self.target_vocab_size, rows.shape[1]).clone()
        if self.exact:
            t_ids = torch.tensor(list(self.exact), dtype=torch.long)
            s_ids = torch.tensor(list(self.exact.values()), dtype=torch.long)
            out[t_ids] = rows[s_ids]
        if self.averaged:
            # Vectorised segment mean: sum the source rows per target id, divide by the counts.
            t_ids = torch.tensor(list(self.averaged), dtype=torch.long)
            lengths = torch.tensor([len(v) for v in self.averaged.values()], dtype=torch.long)
            flat = torch.tensor([s for v in self.averaged.values() for s in v], dtype=torch.long)
            segment = torch.repeat_interleave(torch.arange(len(t_ids)), lengths)
            sums = torch.zeros(len(t_ids), rows.shape[1], dtype=rows.dtype).index_add_(0, segment, rows[flat])
            out[t_ids] = sums / lengths[:, None].to(rows.dtype)
        return out

    def stats(self) -> dict[str, Any]:
        """The alignment_stats.json document."""
        v = self.target_vocab_size
        return {
            "target_vocab_size": v, "source_vocab_size": self.source_vocab_size,
            "exact": len(self.exact), "averaged": len(self.averaged), "unmapped": len(self.unmapped),
            "exact_by_special_role": self.by_role, "padding_rows": self.padding_rows,
            "exact_fraction": round(len(self.exact) / v, 6) if v else 0.0,
            "source_codec": self.source_codec, "target_codec": self.target_codec,
        }


def _greedy_cover(data: bytes, lookup: dict[bytes, int], max_len: int) -> list[int] | None:
    ids, pos = [], 0
    while pos < len(data):
        for length in range(min(max_len, len(data) - pos), 0, -1):
            idx = lookup.get(data[pos:pos + length])
            if idx is not None:
                ids.append(idx)
                pos += length
                break
        else:
            return None
    return ids


def align_vocab(source_tokenizer: Any, target_tokenizer: Any, *, target_vocab_size: int | None = None,
                source_vocab_size: int | None = None, progress: bool = True) -> VocabAlignment:
    """Map every target token id to source rows (see the module docstring for the rules).

    ``progress`` shows a tqdm bar for large vocabularies (>= 20k target tokens), unless inside an
    :func:`osprey_data.progress.progress_bars` ``(False)`` block (a study run with ``--no-progress``).
    """
    src_surfaces, src_added = token_surfaces(source_tokenizer, where="source tokenizer")
    tgt_surfaces, tgt_added = token_surfaces(target_tokenizer, where="target tokenizer")
    source_vocab_size = source_vocab_size or len(source_tokenizer)
    target_vocab_size = target_vocab_size or len(target_tokenizer)
    align = VocabAlignment(target_vocab_size=target_vocab_size, source_vocab_size=source_vocab_size,
                           source_codec=detect_codec(source_tokenizer), target_codec=detect_codec(target_tokenizer))

    usable = {i: s for i, s in src_surfaces.items() if i < source_vocab_size}
    lookup: dict[bytes, int] = {}
    for idx in sorted(usable):  # lowest id wins on duplicate surfaces
        lookup.setdefault(usable[idx], idx)
    max_len = max((len(s) for s in lookup), default=1)
    src_added_by_content = {c: i for i, c in sorted(src_added.items(), reverse=True) if i < source_vocab_size}
    src_role = {r: source_tokenizer.convert_tokens_to_ids(getattr(source_tokenizer, r))
                for r in _ROLES if getattr(source_tokenizer, r, None)}

    pending: dict[int, bytes] = {}
    bar = tqdm(total=2 * target_vocab_size, desc="vocab alignment", unit="tok",
               disable=not progress or not bars_enabled() or target_vocab_size < 20000)
    for t in range(target_vocab_size):
        bar.update()
        if t in tgt_added:
            content = tgt_added[t]
            s = src_added_by_content.get(content)
            if s is None:
                s = _by_role(content, target_tokenizer, src_role, src_added_by_content)
                if s is not None:
                    align.by_role += 1
            if s is None:
                s = lookup.get(content.encode("utf-8"))
            if s is not None and s < source_vocab_size:
                align.exact[t] = s
            else:
                pending[t] = content.encode("utf-8")
        elif t in tgt_surfaces:
            surface = tgt_surfaces[t]
            s = lookup.get(surface)
            if s is not None:
                align.exact[t] = s
            else:
                pending[t] = surface
        else:
            align.unmapped.append(t)
            if t >= len(target_tokenizer):
                align.padding_rows += 1

    # Averaged rows: the source tokenizer's own segmentation when it reproduces the bytes exactly.
    texts = {t: b.decode("utf-8") for t, b in pending.items() if _is_utf8(b)}
    encoded = {}
    if texts:
        batch = source_tokenizer(list(texts.values()), add_special_tokens=False)["input_ids"]
        encoded = dict(zip(texts, batch))
    bar.update(target_vocab_size - len(pending))
    for t, surface in pending.items():
        bar.update()
        ids = encoded.get(t)
        if ids is not None and (not ids or b"".join(usable.get(i, b"\0\0") for i in ids) != surface):
            ids = None  # e.g. a dummy-prefix space was added, or special-token splitting differs
        if ids is None:
            ids = _greedy_cover(surface, lookup, max_len)
        if ids:
            align.averaged[t] = [int(i) for i in ids]
        else:
            align.unmapped.append(t)
    bar.close()
    align.unmapped.sort()
    return align


@torch.no_grad()
def align_backbone_embeddings(backbone: Any, source_tokenizer: Any, target_tokenizer: Any, *,
                              target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, VocabAlignment]:
    """(embedding (Vt, D), LM head (Vt, D), alignment): an HF backbone's input embedding and output head
    (its embedding when tied or absent) carried onto the target vocabulary by :func:`align_vocab`."""
    embed_VsD = backbone.get_input_embeddings().weight.detach().float()
    head = backbone.get_output_embeddings()
    head_VsD = head.weight.detach().float() if head is not None else embed_VsD
    alignment = align_vocab(source_tokenizer, target_tokenizer, target_vocab_size=target_vocab_size,
                            source_vocab_size=embed_VsD.shape[0])
    return alignment.apply(embed_VsD), alignment.apply(head_VsD), alignment


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _by_role(content: str, target_tokenizer: Any, src_role: dict[str, int],
             src_added_by_content: dict[str, int]) -> int | None:
    # Chat-turn markers first: an end-of-turn token that is also eos maps to the source's
    # end-of-turn marker when it has one (what it ends in chat), else to the source's eos.
    for group in CHAT_MARKERS:
        if content in group:
            for other in sorted(group):
                if other in src_added_by_content:
                    return src_added_by_content[other]
    for role in _ROLES:
        if getattr(target_tokenizer, role, None) == content and role in src_role:
            return src_role[role]
    return None

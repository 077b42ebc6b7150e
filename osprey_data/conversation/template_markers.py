"""Chat-template markers inside user content: text that the target reads as turn structure.

A tokenizer turns the text of its special tokens (``<|im_end|>``, ``<|im_start|>``,
``<|eot_id|>`` ...) into those tokens wherever they appear, message content included, and chat
templates paste content in verbatim. So an input whose user turn holds
``<|im_end|>\\n<|im_start|>assistant\\n...`` is fed to the target as a real assistant turn: the
store, ``osprey data show`` and the drafter all see a conversation the input never had. The
builder keeps such samples (a prompt may quote a template on purpose: a question about
tokenizers), but warns, naming the sample, the turn and the marker, and counts them in its
summary. Escaping is left to the user: no tokenizer offers an escape that the target reads
back as the same text.
"""

from __future__ import annotations

from typing import Any

__all__ = ["special_markers", "find_markers", "describe_markers"]


def special_markers(tokenizer: Any) -> tuple[str, ...]:
    """The texts of the tokenizer's special tokens, longest first (at least 2 characters)."""
    texts: set[str] = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(token.content))
    return tuple(sorted((t for t in texts if len(t) >= 2), key=lambda t: (-len(t), t)))


def find_markers(conversation: list[dict[str, str]], markers: tuple[str, ...]) -> list[tuple[int, str, str]]:
    """(turn index, role, marker) for each turn whose content holds a marker (the first found)."""
    found: list[tuple[int, str, str]] = []
    for i, message in enumerate(conversation):
        content = message.get("content") or ""
        hit = next((m for m in markers if m in content), None)
        if hit is not None:
            found.append((i, message.get("role", "?"), hit))
    return found


def describe_markers(where: str, found: list[tuple[int, str, str]]) -> str:
    """One warning line for a sample whose turns hold markers."""
    turns = ", ".join(f"turn {i} ({role}) holds {marker!r}" for i, role, marker in found)
    return (f"warning: {where}: {turns}; the tokenizer reads it as a chat-template token, so the target "
            f"sees turn structure that is not in the input. The sample is built as the target reads it; "
            f"remove or reword the marker in the input if it is meant as text.")

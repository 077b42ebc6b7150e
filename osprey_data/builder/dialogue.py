"""Which assistant turns a sample needs generated, and the conversation as it fills in.

``--regenerate`` (default) replaces every assistant turn with the target's own response, in
order, each conditioned on the turns before it as already regenerated, and answers a final user
turn; ``--last-turn-only`` keeps earlier assistant turns as given and regenerates only the last
one. ``--no-regenerate`` teacher-forces the given turns, answering a final user turn with the
record's ``reference``.

Each generated turn keeps the exact prompt ids it was generated from and the generated ids
(:attr:`Dialogue.generated`): the runner stores the final turn as those ids verbatim, while a
later turn's prompt re-renders earlier turns from their decoded text, as a serving engine does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from osprey_data.conversation.inputs import InputSample
from osprey_data.errors import InputError

__all__ = ["Dialogue", "plan_dialogue", "combine_finish_reasons"]


@dataclass
class Dialogue:
    """One sample on its way through generation."""

    sample: InputSample
    messages: list[dict]
    """Conversation; ``content`` is None for turns still to generate."""
    pending: list[int] = field(default_factory=list)
    """Indices of assistant turns to generate, in order."""
    finish_reasons: list[str] = field(default_factory=list)
    """One per generated turn: ``stop`` or ``length``."""
    truncated: bool = False
    """Cut because a prompt reached ``max_length`` (``--overflow truncate``)."""
    skip_reason: str | None = None
    """Set when the sample is dropped (``too_long``, ...)."""
    generated: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    """Turn index -> (prompt ids fed to the target, ids it generated, stop token included)."""

    @property
    def next_turn(self) -> int | None:
        return self.pending[0] if self.pending else None


def plan_dialogue(sample: InputSample, *, regenerate: bool, last_turn_only: bool) -> Dialogue:
    """Decide which turns to generate for ``sample`` (text samples have none)."""
    messages = [dict(m) for m in sample.conversation]
    if sample.is_text:
        return Dialogue(sample=sample, messages=[])
    ends_with_assistant = messages[-1]["role"] == "assistant"
    if not regenerate:
        if not ends_with_assistant:
            if sample.reference is None:
                raise InputError(  # the runner prefixes file:line and the sample id
                    f"the conversation ends with a {messages[-1]['role']} turn and has no "
                    f"'reference' to teacher-force; use --regenerate or add a reference")
            messages.append({"role": "assistant", "content": sample.reference})
        return Dialogue(sample=sample, messages=messages)
    if not ends_with_assistant:
        messages.append({"role": "assistant", "content": None})
    if last_turn_only:
        pending = [len(messages) - 1]
    else:
        pending = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i in pending:
        if not any(m["role"] == "user" for m in messages[:i]):
            raise InputError(  # the runner prefixes file:line and the sample id
                f"turn {i} is an assistant turn with no user turn before it: there is no prompt to "
                "regenerate it from (drop the leading assistant turn, or use --no-regenerate)")
        messages[i]["content"] = None
    return Dialogue(sample=sample, messages=messages, pending=pending)


def combine_finish_reasons(d: Dialogue) -> str:
    """One reason per sample: truncated > length (any turn) > stop > teacher_forced."""
    if d.truncated:
        return "truncated"
    if "length" in d.finish_reasons:
        return "length"
    if d.finish_reasons:
        return "stop"
    return "teacher_forced"

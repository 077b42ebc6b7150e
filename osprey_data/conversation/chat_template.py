"""Rendering conversations with the target's chat template, and the loss mask.

The loss mask is 1 exactly on the tokens of every assistant turn's body — its content (with a
template-rendered reasoning block, if any) — and on the end-of-turn token that closes it. It is
found without per-template patterns:

1. ``F`` = the whole conversation rendered (no generation prompt) and tokenized with offsets;
2. for assistant turn i, ``A_i`` = the conversation up to turn i rendered *with* the generation
   prompt. A template that is prefix-stable makes ``A_i`` a prefix of ``F``, so the turn body
   starts at character ``len(A_i)``;
3. the body ends at the first stop token (the tokenizer's eos and the model's
   ``generation_config.eos_token_id``: what generation itself stops on) at or after that start,
   bounded by ``B_i`` = the conversation up to and including turn i (when that is a prefix of
   ``F``). Anything the template appends after the stop token (ChatML's newline) is not masked.

Templates that rewrite earlier turns depending on later ones (Qwen3 drops the reasoning of
turns before the last user message) stay correct: only ``A_i`` must be a prefix of ``F``, and it
is, because such rewriting depends on the messages *before* the cut. A template for which it is
not raises :class:`ModelError` naming the turn, never a silently wrong mask.

For a generated final turn the runner does not render the conversation: :meth:`ChatRenderer.
render_prompt` gives the generation prompt (the ids the target was fed, earlier assistant turns
masked as above) and :meth:`RenderedSample.with_response` appends the generated ids verbatim.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from osprey_data.errors import InputError, ModelError

__all__ = ["RenderedSample", "ChatRenderer", "stop_token_ids"]


@dataclass
class RenderedSample:
    """A tokenized conversation with its loss mask (no padding)."""

    token_ids: np.ndarray
    """(T,) int32 token ids."""
    loss_mask: np.ndarray
    """(T,) bool: 1 on assistant bodies and their end-of-turn token."""
    prompt_length: int
    """Tokens before the body of the last assistant turn (the prompt it answers)."""
    text: str
    """The rendered text the ids were tokenized from."""
    truncated: bool = False
    """True when the sequence was cut to ``max_length``."""

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    def with_response(self, generated_ids: list[int], text: str) -> "RenderedSample":
        """This prompt followed by ``generated_ids`` verbatim, all of them in the loss mask.

        ``generated_ids`` are the ids the target produced (its stop token included when it
        stopped on one); nothing is re-tokenized and no template closing tokens are added.
        """
        gen = np.asarray(generated_ids, dtype=np.int32)
        return RenderedSample(
            token_ids=np.concatenate([self.token_ids, gen]),
            loss_mask=np.concatenate([self.loss_mask, np.ones(gen.shape[0], dtype=bool)]),
            prompt_length=self.num_tokens,
            text=self.text + text,
        )

    def truncate(self, max_length: int) -> "RenderedSample":
        """First ``max_length`` tokens (mask and prompt length cut accordingly)."""
        if self.num_tokens <= max_length:
            return self
        return RenderedSample(
            token_ids=self.token_ids[:max_length].copy(),
            loss_mask=self.loss_mask[:max_length].copy(),
            prompt_length=min(self.prompt_length, max_length),
            text=self.text,
            truncated=True,
        )


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> frozenset[int]:
    """Token ids that end an assistant turn: tokenizer eos plus generation-config eos ids."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, (list, tuple)):
        ids.update(int(i) for i in gen_eos)
    if not ids:
        raise ModelError("the target defines no eos token (tokenizer or generation_config); "
                         "cannot tell where an assistant turn ends")
    return frozenset(ids)


class ChatRenderer:
    """Renders conversations with one tokenizer's chat template and computes loss masks."""

    def __init__(self, tokenizer: Any, *, stop_ids: frozenset[int] | set[int],
                 template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.template_kwargs = dict(template_kwargs or {})
        if not getattr(tokenizer, "is_fast", False):
            raise ModelError("the builder needs a fast tokenizer (offset mappings) to compute "
                             "loss masks; this target's tokenizer is a slow one")

    # --- rendering --------------------------------------------------------------------------

    def render_text(self, conversation: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
        """The chat template applied to ``conversation`` as text."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ModelError("the target tokenizer has no chat template; give pre-formatted "
                             "`text` inputs or a target with a chat template")
        try:
            return self.tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                **self.template_kwargs,
            )
        except Exception as exc:  # jinja raises TemplateError / its own exceptions
            raise InputError(f"the chat template failed on this conversation: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered text (templates carry their own special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generation_prompt_ids(self, conversation: list[dict[str, str]]) -> list[int]:
        """Token ids the target continues from to answer after ``conversation``."""
        return self.encode(self.render_text(conversation, add_generation_prompt=True))

    def decode_response(self, token_ids: list[int]) -> str:
        """Text of generated ids (the stop token, if any, already removed by the caller)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    # --- full sequences with masks ----------------------------------------------------------

    def render(self, conversation: list[dict[str, str]]) -> RenderedSample:
        """Render + tokenize a complete conversation and mask its assistant turns.

        Raises:
            InputError: the conversation has no assistant turn.
            ModelError: the template is not prefix-stable at some assistant turn.
        """
        if not any(m["role"] == "assistant" for m in conversation):
            raise InputError("conversation has no assistant turn to learn from")
        return self._render_masked(conversation, add_generation_prompt=False)

    def render_prompt(self, conversation: list[dict[str, str]]) -> RenderedSample:
        """The generation prompt after ``conversation`` with its earlier assistant turns masked.

        The ids are exactly :meth:`generation_prompt_ids` (what the target is fed); the mask is
        the template-diff mask of the assistant turns inside it (all zero when there are none);
        ``prompt_length`` is the whole length. :meth:`RenderedSample.with_response` then appends
        the generated ids verbatim.
        """
        rendered = self._render_masked(conversation, add_generation_prompt=True)
        expected = self.generation_prompt_ids(conversation)
        if rendered.token_ids.tolist() != expected:  # offsets tokenization must not change ids
            raise ModelError("tokenizing the generation prompt with offsets gave other ids than "
                             "without; cannot mask the prompt the target was fed")
        rendered.prompt_length = rendered.num_tokens
        return rendered

    def _render_masked(self, conversation: list[dict[str, str]], *, add_generation_prompt: bool) -> RenderedSample:
        """Tokenize the rendering of ``conversation`` and mask the assistant turns inside it."""
        assistant_turns = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        full = self.render_text(conversation, add_generation_prompt=add_generation_prompt)
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(enc["input_ids"], dtype=np.int32)
        # Token end offsets, used to find the first token overlapping a character position.
        ends = np.asarray([e for _, e in enc["offset_mapping"]], dtype=np.int64)
        starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
        mask = np.zeros(ids.shape[0], dtype=bool)
        prompt_length = 0
        for i in assistant_turns:
            body_start = self._body_start(conversation, i, full)
            upto = self.render_text(conversation[: i + 1], add_generation_prompt=False)
            body_bound = len(upto) if full.startswith(upto) and len(upto) > body_start else len(full)
            # First token that overlaps the body: a token merged across the boundary is included.
            first = int(np.searchsorted(ends, body_start, side="right"))
            j = first
            while j < ids.shape[0] and starts[j] < body_bound:
                mask[j] = True
                if int(ids[j]) in self.stop_ids:
                    break
                j += 1
            prompt_length = first
        return RenderedSample(token_ids=ids, loss_mask=mask, prompt_length=prompt_length, text=full)

    def _body_start(self, conversation: list[dict[str, str]], i: int, full: str) -> int:
        """Character offset in ``full`` where assistant turn ``i``'s body begins."""
        head = self.render_text(conversation[:i], add_generation_prompt=True) if i else ""
        if full.startswith(head):
            return len(head)
        # Some templates render a generation prompt that the finished turn does not keep (Qwen3
        # with enable_thinking=False drops the empty think block of earlier turns): the body then
        # starts where the generation-prompt rendering and the full rendering diverge, provided
        # the history itself (no generation prompt) is a prefix.
        history = self.render_text(conversation[:i], add_generation_prompt=False) if i else ""
        start = len(os.path.commonprefix([head, full]))
        if not full.startswith(history) or start < len(history):
            raise ModelError(
                f"chat template is not prefix-stable at assistant turn {i}: the conversation up to "
                f"that turn does not render as a prefix of the whole conversation, so the turn "
                f"cannot be located; loss mask refused"
            )
        return start

    def render_preformatted(self, text: str) -> RenderedSample:
        """Pre-formatted text: every token after the first is a training target."""
        ids = np.asarray(self.encode(text), dtype=np.int32)
        if ids.shape[0] < 2:
            raise InputError("pre-formatted text has fewer than 2 tokens")
        mask = np.ones(ids.shape[0], dtype=bool)
        mask[0] = False
        return RenderedSample(token_ids=ids, loss_mask=mask, prompt_length=1, text=text)

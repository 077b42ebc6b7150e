"""A draft-tree shape as SGLang's EAGLE worker takes it: ``(steps, topk, num_draft_tokens)``.

The three numbers are SGLang's ``--speculative-num-steps``, ``--speculative-eagle-topk`` and
``--speculative-num-draft-tokens``:

* ``steps``: tree depth, i.e. draft tokens on the longest path (one drafter step per depth);
* ``topk``: children proposed by every expanded node, and the number of nodes expanded per depth;
* ``num_draft_tokens``: tokens the target verifies in one pass, the root (the last committed token)
  included, so ``num_draft_tokens - 1`` draft nodes are kept.

SGLang's rules kept here:

* with ``topk == 1`` the server sets ``num_draft_tokens = steps + 1`` whatever was asked (a chain);
  :meth:`TreeShape.from_flags` applies that adjustment and says so, the constructor refuses any
  other value so a shape in a report always is what would be served;
* the ``num_draft_tokens - 1`` kept nodes are picked among the ``topk + (steps - 1) * topk**2``
  candidates the growth produces (:func:`max_draft_nodes`); asking for more makes SGLang's
  ``torch.topk`` fail, so it is refused here.

Bounds of Osprey's own (:data:`MAX_STEPS`, :data:`MAX_TOPK`, :data:`MAX_DRAFT_TOKENS`): a shape
beyond them is no serving configuration anyone runs (SGLang's trees are a few steps of topk <= 10
and verify tens of tokens; beyond these the tree costs more than it can accept). They keep a
hand-edited or damaged ``sweep.json`` with ``topk = 10**9`` out of the recommended flags, and a
grid from allocating a tree that size.

Kept free of torch so the CLI can parse and check shapes before loading any model.
"""

from __future__ import annotations

from dataclasses import dataclass

from osprey_data.errors import ConfigError

__all__ = ["TreeShape", "max_draft_nodes", "parse_tree_shape", "MAX_STEPS", "MAX_TOPK", "MAX_DRAFT_TOKENS"]

MAX_STEPS = 64
"""Most tree depths (draft steps) of a shape."""
MAX_TOPK = 64
"""Most children per node (``--speculative-eagle-topk``) of a shape."""
MAX_DRAFT_TOKENS = 1024
"""Most tokens verified per round (``--speculative-num-draft-tokens``) of a shape."""


def max_draft_nodes(steps: int, topk: int) -> int:
    """Candidate nodes a tree of ``steps`` depths and ``topk`` children grows (root excluded)."""
    return topk + (steps - 1) * topk * topk


@dataclass(frozen=True)
class TreeShape:
    """One SGLang EAGLE tree configuration (see the module docstring)."""

    steps: int
    """``--speculative-num-steps``: tree depth (draft tokens on the longest path)."""
    topk: int
    """``--speculative-eagle-topk``: children per expanded node and nodes expanded per depth."""
    num_draft_tokens: int
    """``--speculative-num-draft-tokens``: tokens verified per round, the root included."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"tree shape {self.label}: steps must be >= 1")
        if self.topk < 1:
            raise ConfigError(f"tree shape {self.label}: topk must be >= 1")
        if self.num_draft_tokens < 2:
            raise ConfigError(f"tree shape {self.label}: num_draft_tokens must be >= 2 (the root and one draft)")
        for name, most in (("steps", MAX_STEPS), ("topk", MAX_TOPK), ("num_draft_tokens", MAX_DRAFT_TOKENS)):
            if getattr(self, name) > most:
                raise ConfigError(f"tree shape {self.label}: {name} = {getattr(self, name)} is beyond Osprey's bound "
                                  f"of {most} (no served tree is that large; see osprey_train/evaluation/tree_shape.py)")
        if self.topk == 1 and self.num_draft_tokens != self.steps + 1:
            raise ConfigError(f"tree shape {self.label}: with topk = 1 SGLang serves a chain of num_draft_tokens = "
                              f"steps + 1 = {self.steps + 1}; use {self.steps},1,{self.steps + 1}")
        most = max_draft_nodes(self.steps, self.topk)
        if self.num_draft_tokens - 1 > most:
            raise ConfigError(f"tree shape {self.label}: a tree of {self.steps} steps with topk {self.topk} has only "
                              f"{most} candidate nodes, so num_draft_tokens can be at most {most + 1}")

    @classmethod
    def chain(cls, steps: int) -> "TreeShape":
        """The chain of ``steps`` drafts (topk 1)."""
        return cls(steps=steps, topk=1, num_draft_tokens=steps + 1)

    @classmethod
    def from_flags(cls, steps: int, topk: int, num_draft_tokens: int) -> tuple["TreeShape", str | None]:
        """The shape SGLang serves for these flags, and a note when it adjusted them (topk = 1)."""
        if topk == 1 and steps >= 1 and num_draft_tokens != steps + 1:
            note = (f"topk = 1: SGLang adjusts num_draft_tokens {num_draft_tokens} to steps + 1 = {steps + 1} "
                    "(a chain)")
            return cls.chain(steps), note
        return cls(steps=steps, topk=topk, num_draft_tokens=num_draft_tokens), None

    @property
    def label(self) -> str:
        """``"S,K,N"``, the form the CLI takes."""
        return f"{self.steps},{self.topk},{self.num_draft_tokens}"

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    def to_dict(self) -> dict[str, int]:
        return {"steps": self.steps, "topk": self.topk, "num_draft_tokens": self.num_draft_tokens}

    def sglang_flags(self) -> list[str]:
        """The ``--speculative-*`` flags of this shape (without algorithm and draft model path)."""
        return ["--speculative-num-steps", str(self.steps), "--speculative-eagle-topk", str(self.topk),
                "--speculative-num-draft-tokens", str(self.num_draft_tokens)]


def parse_tree_shape(text: str, *, option: str = "--tree") -> tuple[TreeShape, str | None]:
    """``"STEPS,TOPK,NUM_DRAFT_TOKENS"`` -> (shape as SGLang serves it, adjustment note or None)."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        steps, topk, num = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected STEPS,TOPK,NUM_DRAFT_TOKENS, three integers "
                          "(e.g. 5,4,8)") from None
    return TreeShape.from_flags(steps, topk, num)

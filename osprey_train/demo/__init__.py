"""``osprey demo``: the whole recipe on a small real model (see docs/demo.md).

Submodules: ``config`` (DemoConfig and presets), ``fetch`` (SmolLM2 from PyPI), ``pipeline``
(``run``), ``report`` (markdown + PNG); ``prompts.jsonl`` is the shipped prompt set.
"""

__all__: list[str] = []

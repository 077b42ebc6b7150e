"""``osprey study``: declarative, resumable comparisons of drafters (see docs/study.md).

Submodules: ``config`` (StudyConfig from TOML), ``plan`` (stages keyed by their inputs), ``stages``
(one executor per stage kind), ``runner`` (``run``), ``status``, ``results``, ``claims``, ``report``.
"""

__all__: list[str] = []

"""Greedy chain drafting over a stored sequence: the drafts of every verify round at once.

Layout (:mod:`osprey_train.ttt.layout`, SGLang's draft extend): once ``x_0 .. x_{q+1}`` are
committed, the target has produced taps ``c_0 .. c_q`` and the drafter's cache holds slots
``0 .. q``, slot ``j`` being ``(x_{j+1}, fuse_taps(c_j))`` at position ``j``. The round's chain
proposes ``d_1 .. d_S`` for ``x_{q+2} .. x_{q+S+1}``: ``d_1`` from slot ``q``'s hidden state,
``d_k`` (k >= 2) from feeding ``d_{k-1}`` with the previous step's pre-norm hidden state as the
condition at position ``q + k - 1`` (SGLang's decode steps).

:func:`draft_all_positions` drafts the chains of EVERY slot of a sequence in ``S`` batched passes
using TTT attention (step-0 keys of the prefix + the chain's own keys): exact, and ``O(S)``
forward passes per sequence, which is what makes offline acceptance cheap. The incremental form
with a KV cache and rollback (what a live decoder does) is
:class:`~osprey_train.evaluation.live_drafter.DrafterSession`; the tests check the two agree, and
``tests/train/evaluation/test_sglang_layout.py`` checks this one against SGLang's draft-extend +
decode semantics written out independently.

Drafts are TARGET-vocabulary ids (draft-vocabulary ids of EAGLE-3 drafters and of Osprey drafters
converted with ``--draft-vocab`` mapped through :class:`VocabMap`).

Legend: T tokens, P = T - 1 slots, L taps, Dt target hidden, D drafter hidden, S draft steps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from osprey_train.ttt.layout import slot_inputs
from osprey_train.ttt.loss import VocabMap
from osprey_train.ttt.unroll import ttt_hidden_states

__all__ = ["draft_all_positions", "greedy_draft_ids"]


def greedy_draft_ids(drafter, hidden_ND: Tensor, chunk: int = 2048) -> Tensor:
    """Greedy draft-vocabulary id per row, the LM head applied ``chunk`` rows at a time."""
    outs = [drafter.logits(hidden_ND[i:i + chunk]).argmax(-1) for i in range(0, hidden_ND.shape[0], chunk)]
    return torch.cat(outs) if outs else hidden_ND.new_zeros(0, dtype=torch.long)


@torch.no_grad()
def draft_all_positions(drafter, token_ids_T: Tensor, taps_TLDt: Tensor, steps: int, *,
                        impl: str = "sdpa") -> Tensor:
    """Greedy chain drafts of every slot: (T - 1, S) target ids; row q = drafts for ``x_{q+2} ..``.

    Row ``q`` is what the drafter proposes in the verify round whose last committed token is
    ``x_{q+1}``.
    """
    device = next(drafter.parameters()).device
    ids_P, taps_PLDt = slot_inputs(token_ids_T.to(device).long(), taps_TLDt.to(device))
    num = ids_P.shape[0]
    if num == 0:
        return torch.zeros(0, steps, dtype=torch.long, device=device)
    vocab = VocabMap.from_drafter(drafter.draft_to_target, drafter.config.vocab_size)
    cond0_1PD = drafter.fuse_taps(taps_PLDt[None])
    pos_1P = torch.arange(num, device=device)[None]
    doc_1P = torch.zeros_like(pos_1P)
    draft_ids: list[Tensor] = []

    def next_tokens(k: int, hidden_prev: Tensor) -> Tensor:
        return draft_ids[-1][None]  # the chain feeds back its previous draft (embeddings are over target ids)

    def on_step(k: int, hidden: Tensor) -> None:
        draft_ids.append(vocab.to_target(greedy_draft_ids(drafter, hidden[0])))

    ttt_hidden_states(drafter, ids_P[None], cond0_1PD, pos_1P, doc_1P, steps, impl=impl,
                      next_tokens=next_tokens, on_step=on_step)
    return torch.stack(draft_ids, dim=1)

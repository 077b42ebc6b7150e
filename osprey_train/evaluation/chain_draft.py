"""Greedy chain drafting with a drafter: all verify positions at once, or one at a time.

Position convention (shared with :mod:`osprey_train.evaluation.spec_decode` and the TTT unroll):
position ``t`` holds token ``x_t``; the target's taps at ``t`` predict ``x_{t+1}``; the drafter
consumes ``(x_t, c_{t-1})`` at position ``t`` (zeros for ``c_{-1}``). A chain started at verify
position ``p`` (the last committed token) proposes ``d_1 .. d_S`` for positions ``p+1 .. p+S``:
step 0 reads ``(x_p, c_{p-1})`` over the KV cache of the committed prefix; step ``k`` reads
``(d_k, h^{k-1})`` at position ``p + k``.

* :func:`draft_all_positions` drafts the chains of EVERY position of a sequence in ``S`` batched
  passes, using TTT attention (step-0 keys of the prefix + the chain's own keys); exact and
  ``O(S)`` forward passes per sequence, which is what makes offline acceptance cheap.
* :class:`ChainDraftState` is the incremental form with a KV cache and rollback (what a live
  decoder does): ``commit`` accepted tokens with their conditions, ``propose`` ``S`` tokens.

Both return TARGET-vocabulary ids (EAGLE-3 draft ids are mapped through ``draft_to_target``).

Legend: T tokens, L taps, Dt target hidden, D drafter hidden, S draft steps, V draft vocab.
"""

from __future__ import annotations

import torch
from torch import Tensor

from osprey_train.models import KVCacheAttention
from osprey_train.ttt.unroll import ttt_hidden_states

__all__ = ["draft_all_positions", "ChainDraftState", "previous_conditions"]


def _to_target(drafter, draft_ids: Tensor) -> Tensor:
    d2t = drafter.draft_to_target
    return draft_ids if d2t is None else d2t.to(draft_ids.device)[draft_ids]


def _argmax_rows(drafter, hidden_ND: Tensor, chunk: int = 2048) -> Tensor:
    """Greedy draft id per row, the LM head applied ``chunk`` rows at a time."""
    outs = [drafter.logits(hidden_ND[i:i + chunk]).argmax(-1) for i in range(0, hidden_ND.shape[0], chunk)]
    return torch.cat(outs) if outs else hidden_ND.new_zeros(0, dtype=torch.long)


def previous_conditions(drafter, taps_TLDt: Tensor) -> Tensor:
    """``cond[t] = fuse_taps(taps[t-1])``, zeros at t = 0. Returns (T, D)."""
    fused_TD = drafter.fuse_taps(taps_TLDt[None])[0]
    return torch.cat([torch.zeros_like(fused_TD[:1]), fused_TD[:-1]], dim=0)


@torch.no_grad()
def draft_all_positions(drafter, token_ids_T: Tensor, taps_TLDt: Tensor, steps: int, *,
                        impl: str = "sdpa") -> Tensor:
    """Greedy chain drafts of every verify position: (T, S) target ids; row p = d_1..d_S."""
    T = token_ids_T.shape[0]
    device = next(drafter.parameters()).device
    ids_1T = token_ids_T.to(device).long()[None]
    cond0_1TD = previous_conditions(drafter, taps_TLDt.to(device))[None]
    pos_1T = torch.arange(T, device=device)[None]
    doc_1T = torch.zeros_like(ids_1T)
    drafts: list[Tensor] = []

    def next_tokens(k: int, hidden_prev: Tensor) -> Tensor:
        return drafts[-1][None]  # chain feeds back its own previous draft

    def on_step(k: int, hidden: Tensor) -> None:
        drafts.append(_to_target(drafter, _argmax_rows(drafter, hidden[0])))

    ttt_hidden_states(drafter, ids_1T, cond0_1TD, pos_1T, doc_1T, steps, impl=impl,
                      next_tokens=next_tokens, on_step=on_step)
    return torch.stack(drafts, dim=1)


class ChainDraftState:
    """Incremental chain drafting over a KV cache (the live-decoding form).

    ``commit(ids, conds)`` appends committed tokens with their step-0 conditions (``c_{t-1}``,
    e.g. from :func:`previous_conditions` or ``fuse_taps`` of fresh target taps); ``propose(S)``
    drafts ``S`` tokens after the last committed one and rolls the cache back to the committed
    length, so the next ``commit`` continues from there.
    """

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.cache = KVCacheAttention(drafter.config.num_layers)
        self.length = 0
        self.last_hidden_D: Tensor | None = None

    @torch.no_grad()
    def commit(self, token_ids_N: Tensor, cond_ND: Tensor) -> None:
        device = next(self.drafter.parameters()).device
        n = token_ids_N.shape[0]
        if n == 0:
            return
        pos = torch.arange(self.length, self.length + n, device=device)[None]
        h = self.drafter.forward_hidden(token_ids_N.to(device).long()[None], cond_ND.to(device)[None],
                                        pos, self.cache)
        self.length += n
        self.last_hidden_D = h[0, -1]

    @torch.no_grad()
    def propose(self, steps: int) -> list[int]:
        if self.last_hidden_D is None:
            raise RuntimeError("ChainDraftState.propose before any commit")
        device = self.last_hidden_D.device
        h = self.last_hidden_D
        out: list[int] = []
        for k in range(steps):
            tok = _to_target(self.drafter, self.drafter.logits(h[None]).argmax(-1))
            out.append(int(tok[0]))
            if k == steps - 1:
                break
            pos = torch.tensor([[self.length + k]], device=device)
            h = self.drafter.forward_hidden(tok[None], h[None, None], pos, self.cache)[0, 0]
        self.cache.truncate(self.length)
        return out

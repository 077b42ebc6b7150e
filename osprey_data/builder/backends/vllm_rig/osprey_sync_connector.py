"""A synchronous hidden-states KV connector for vLLM (runs in the vLLM venv only).

vLLM 0.32 captures the tapped (auxiliary) hidden states of a request with the
``extract_hidden_states`` speculative method: a cache-only attention layer writes the stacked
states of every scheduled token into a KV-cache group of their own, and
``ExampleHiddenStatesConnector`` copies a finished request's slots to a safetensors file before
its blocks are freed. Its copy is asynchronous on a CUDA stream (an event per request, polled in
``get_finished``), which has no CPU counterpart. This subclass replaces only that step: the slots
are gathered and written at once, in the worker thread, and the request is reported done on the
next poll through an always-complete stand-in for the CUDA event. Everything else (file names,
lock files, the scheduler side) stays vLLM's.

Written file (vLLM's layout): ``hidden_states`` (T, L, D) in the KV-cache dtype (the model's),
``token_ids`` (T,), for the prompt tokens (T = prompt length).
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, extract_from_kv_cache,
)

__all__ = ["OspreySyncHiddenStatesConnector"]


class _Done:
    """Stands in for the CUDA event the parent polls: the copy finished before it was recorded."""

    @staticmethod
    def query() -> bool:
        return True


class OspreySyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` with a synchronous write (CPU workers have no streams)."""

    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        bs = self._block_size
        blocks_B = torch.tensor(pending.block_ids, dtype=torch.long)
        # every slot of the request's blocks, in order; the first T hold its T tokens
        slots_S = (blocks_B[:, None] * bs + torch.arange(bs, dtype=torch.long)[None, :]).reshape(-1)
        n = int(pending.token_ids.shape[0])
        hidden_TLD = extract_from_kv_cache(self._kv_cache, slots_S.to(self._kv_cache.device), n).to("cpu").clone()
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file({"hidden_states": hidden_TLD, "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the reader's wait
        self._req_copy_events[pending.req_id] = _Done()

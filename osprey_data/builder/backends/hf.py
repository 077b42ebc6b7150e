"""HF transformers backend: batched generation (left padding, KV cache) and batched prefill.

Generation is a small explicit decoding loop rather than ``model.generate`` so that every row
samples from its own ``torch.Generator`` (seeded per sample and turn): a sample draws the same
tokens whatever batch or worker it lands in. Rows that finish leave the batch and the KV cache
(``Cache.reorder_cache``), so a long answer does not make the short ones pay for its steps. Features come from one prefill of the final
sequences (right padding, which causal attention never sees from real positions) with
forward pre-hooks on the decoder layers (:class:`~osprey_data.target_model.TapCapture`): the input of
layer i is exactly HF's ``hidden_states[i]``; tap ``L`` is the post-norm last hidden state, as in HF. Logits are
computed only for real (unpadded) positions, in chunks, through the model's own output head —
checked once at start-up against the full model's logits so that models with extra logit
processing are never silently mis-handled.

Legend: B batch, T tokens, N flattened real tokens, L taps, D hidden, K top-k, V vocab.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from osprey_data.builder.backends.base import (
    GenerationRequest, GenerationResult, SamplingParams, SequenceFeatures, StepCallback, TargetBackend,
)
from osprey_data.conversation.chat_template import stop_token_ids
from osprey_data.errors import ConfigError, ModelError
from osprey_data.target_model import (TapCapture, decoder_layers, identify_target, load_hf_target, resolve_device,
                                      resolve_precision, text_config)

if TYPE_CHECKING:  # pragma: no cover
    from osprey_data.builder.config import BuildConfig

__all__ = ["HFBackend", "resolve_dtype", "decoder_layers", "sample_next"]

# Upper bound on the float32 logits materialized at once (elements), ~256 MB.
_LOGITS_BUDGET = 1 << 26



def resolve_dtype(name: str, device: str) -> torch.dtype:
    """The weights dtype of ``--dtype name`` on ``device`` (:func:`resolve_precision`: ``auto`` is
    bfloat16 on accelerators and on CPUs with bf16 matrix units, float32 on other CPUs)."""
    return resolve_precision(name, device, what="--dtype").weights


def sample_next(logits_BV: torch.Tensor, params: SamplingParams,
                generators: list[torch.Generator] | None) -> torch.Tensor:
    """Next token per row: argmax when greedy, else temperature + top-p sampling per row."""
    if params.greedy:
        return logits_BV.argmax(dim=-1)
    assert generators is not None
    probs_BV = torch.softmax(logits_BV.float() / params.temperature, dim=-1)
    out = torch.empty(logits_BV.shape[0], dtype=torch.long, device=logits_BV.device)
    for b in range(logits_BV.shape[0]):
        p_V = probs_BV[b]
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(p_V, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (always at least one token).
            keep = (sorted_p.cumsum(0) - sorted_p) < params.top_p
            filtered = torch.zeros_like(p_V)
            filtered[order[keep]] = sorted_p[keep]
            p_V = filtered / filtered.sum()
        out[b] = torch.multinomial(p_V, 1, generator=generators[b])[0]
    return out


class HFBackend(TargetBackend):
    """Runs a transformers causal LM on CPU or CUDA."""

    name = "hf"

    def __init__(self, config: "BuildConfig") -> None:
        self.device = resolve_device(config.device)
        self.precision = resolve_precision(config.dtype, self.device, what="--dtype")
        self.dtype = self.precision.weights
        self.model, self.tokenizer = load_hf_target(config.target, gguf_file=config.gguf_file,
                                                    device=self.device, dtype=self.dtype)
        self.precision.prepare(self.model)  # bf16 on CPU: prepacked linears (decode steps are GEMVs)
        self.identity = identify_target(self.model, self.tokenizer, config.target)
        self.stop_ids = stop_token_ids(self.tokenizer, getattr(self.model, "generation_config", None))
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else min(self.stop_ids)
        self.layers = decoder_layers(self.model)
        self.base = getattr(self.model, "base_model", None)
        if self.base is None or self.base is self.model:
            raise ModelError(f"{type(self.model).__name__} has no separate base model to prefill")
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self._check_head()

    # --- output head ------------------------------------------------------------------------

    def _head(self, hidden_ND: torch.Tensor) -> torch.Tensor:
        """Logits from post-norm hidden states, with the model's logit post-processing."""
        cfg = text_config(self.model.config)
        logits_NV = self.model.get_output_embeddings()(hidden_ND).float()
        scaling = getattr(cfg, "logits_scaling", None)  # Granite divides
        if scaling:
            logits_NV = logits_NV / scaling
        scale = getattr(cfg, "logit_scale", None)  # Cohere multiplies
        if scale:
            logits_NV = logits_NV * scale
        cap = getattr(cfg, "final_logit_softcapping", None)  # Gemma-2 style soft cap
        if cap:
            logits_NV = torch.tanh(logits_NV / cap) * cap
        return logits_NV

    @torch.inference_mode()
    def _check_head(self) -> None:
        """Our chunked head must reproduce the model's own logits (guards unknown post-processing)."""
        vocab = self.identity.vocab_size
        ids_BT = (torch.arange(8, device=self.device) * 7919 % vocab).unsqueeze(0)
        with self.precision.context():
            ref_BTV = self.model(input_ids=ids_BT, use_cache=False).logits.float()
            ours_TV = self._head(self.base(input_ids=ids_BT, use_cache=False).last_hidden_state[0])
        tol = 1e-3 if self.precision.name == "float32" else 5e-2
        err = (ours_TV - ref_BTV[0]).abs().max().item()
        if not err <= tol * max(1.0, ref_BTV.abs().max().item()):
            raise ModelError(f"{type(self.model).__name__}: logits from the output head differ from the "
                             f"model's own logits by {err:.3g}; this architecture post-processes logits "
                             f"in a way the HF backend does not know")

    # --- generation ---------------------------------------------------------------------------

    def _forward(self, **kwargs: Any) -> Any:
        if "cache" in kwargs and self._cache_kw != "cache":
            kwargs[self._cache_kw] = kwargs.pop("cache")
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(**kwargs)

    @staticmethod
    def _cache_of(out: Any) -> Any:
        cache = getattr(out, "cache", None)
        return cache if cache is not None else getattr(out, "past_key_values", None)

    def generate(self, requests: list[GenerationRequest], params: SamplingParams, *,
                 on_step: StepCallback | None = None) -> list[GenerationResult]:
        with self.precision.context():
            return self._generate(requests, params, on_step=on_step)

    @torch.inference_mode()
    def _generate(self, requests: list[GenerationRequest], params: SamplingParams, *,
                  on_step: StepCallback | None = None) -> list[GenerationResult]:
        if not requests:
            return []
        B = len(requests)
        lens = [len(r.prompt_ids) for r in requests]
        if min(lens) == 0:
            raise ConfigError("cannot generate from an empty prompt")
        T = max(lens)
        ids_BT = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask_BT = torch.zeros((B, T), dtype=torch.long)
        for b, r in enumerate(requests):  # left padding: every row's last token is at T-1
            ids_BT[b, T - lens[b]:] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask_BT[b, T - lens[b]:] = 1
        ids_BT, mask_BT = ids_BT.to(self.device), mask_BT.to(self.device)
        pos_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        generators = None
        if not params.greedy:
            generators = [torch.Generator(device=self.device).manual_seed(r.seed) for r in requests]
        out = self._forward(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT, use_cache=True)
        cache = self._cache_of(out)
        tokens: list[list[int]] = [[] for _ in range(B)]
        reasons: list[str | None] = [None] * B
        stops: list[int | None] = [None] * B
        rows = list(range(B))  # request index of each row still being decoded
        pos_B1 = pos_BT[:, -1:]
        for _ in range(params.max_new_tokens):
            next_B = sample_next(out.logits[:, -1, :], params, generators)
            for k, tok in enumerate(next_B.tolist()):
                b = rows[k]
                if tok in self.stop_ids:
                    reasons[b], stops[b] = "stop", tok
                else:
                    tokens[b].append(tok)
                    if len(tokens[b]) >= params.max_new_tokens:
                        reasons[b] = "length"
            if on_step is not None:
                on_step([b for b in rows if reasons[b] is not None], len(rows))
            keep = [k for k, b in enumerate(rows) if reasons[b] is None]
            if not keep:
                break
            if len(keep) < len(rows):
                # Finished rows leave the batch (and the KV cache), so they cost nothing more.
                idx = torch.tensor(keep, device=self.device)
                cache.reorder_cache(idx)
                next_B, mask_BT, pos_B1 = next_B[idx], mask_BT[idx], pos_B1[idx]
                rows = [rows[k] for k in keep]
                if generators is not None:
                    generators = [generators[k] for k in keep]
            mask_BT = torch.cat([mask_BT, torch.ones((len(rows), 1), dtype=mask_BT.dtype, device=self.device)], dim=1)
            pos_B1 = pos_B1 + 1
            out = self._forward(input_ids=next_B.unsqueeze(1), attention_mask=mask_BT, position_ids=pos_B1,
                                cache=cache, use_cache=True)
            cache = self._cache_of(out)
        return [GenerationResult(token_ids=t, finish_reason=r or "length", stop_token_id=s)
                for t, r, s in zip(tokens, reasons, stops)]

    # --- features -----------------------------------------------------------------------------

    def features(self, sequences: list[np.ndarray], *, taps: tuple[int, ...], topk: int,
                 final_hidden: bool) -> list[SequenceFeatures]:
        with self.precision.context():
            return self._features(sequences, taps=taps, topk=topk, final_hidden=final_hidden)

    @torch.no_grad()  # not inference_mode: returned tensors must be ordinary (writable) tensors
    def _features(self, sequences: list[np.ndarray], *, taps: tuple[int, ...], topk: int,
                  final_hidden: bool) -> list[SequenceFeatures]:
        if not sequences:
            return []
        capture = TapCapture(self.model, taps, layers=self.layers)
        B = len(sequences)
        lens = [int(len(s)) for s in sequences]
        T = max(lens)
        ids_BT = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask_BT = torch.zeros((B, T), dtype=torch.long)
        for b, s in enumerate(sequences):  # right padding: real positions never attend to pads
            ids_BT[b, : lens[b]] = torch.as_tensor(np.asarray(s, dtype=np.int64))
            mask_BT[b, : lens[b]] = 1
        ids_BT, mask_BT = ids_BT.to(self.device), mask_BT.to(self.device)

        with capture:  # tap L (the post-norm last state) is the base model's output, as in HF
            last_BTD = self.base(input_ids=ids_BT, attention_mask=mask_BT, use_cache=False).last_hidden_state
        taps_BTLD = capture.stacked(dim=2)

        # Top-k over the full softmax, only at real positions, a chunk of tokens at a time.
        real_N = mask_BT.reshape(-1).bool()
        last_ND = last_BTD.reshape(B * T, -1)[real_N]
        chunk = max(1, _LOGITS_BUDGET // self.identity.vocab_size)
        ids_parts, lp_parts = [], []
        for start in range(0, last_ND.shape[0], chunk):
            logits_NV = self._head(last_ND[start:start + chunk])
            # top-k of the logits minus logsumexp = top-k of log_softmax, without writing a second
            # (N, V) tensor: the full-softmax normalizer is kept, so the tail mass stays recoverable
            top_NK, ids_NK = torch.topk(logits_NV, topk, dim=-1, sorted=True)
            lp_NK = top_NK - torch.logsumexp(logits_NV, dim=-1, keepdim=True)
            ids_parts.append(ids_NK.to(torch.int32).cpu())
            lp_parts.append(lp_NK.cpu())
        topk_ids_NK = torch.cat(ids_parts).numpy()
        topk_lp_NK = torch.cat(lp_parts).numpy()

        out: list[SequenceFeatures] = []
        offset = 0
        for b, n in enumerate(lens):
            out.append(SequenceFeatures(
                hidden_TLD=taps_BTLD[b, :n].to("cpu", copy=True),
                topk_ids_TK=topk_ids_NK[offset:offset + n],
                topk_logprobs_TK=topk_lp_NK[offset:offset + n],
                final_hidden_TD=last_BTD[b, :n].to("cpu", copy=True) if final_hidden else None,
            ))
            offset += n
        return out

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

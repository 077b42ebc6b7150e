"""vLLM model class serving the Osprey drafter as an EAGLE-3-style draft model (imported by vLLM only).

vLLM's EAGLE-3 proposer drives any draft model through one small interface, which
``Eagle3LlamaForCausalLM`` implements for the one-layer baseline; this class implements it for the
Osprey drafter (N source-family layers, each reading the condition through extra q/k/v columns):

- ``combine_hidden_states(taps)``: the target's concatenated taps (width L*Dt, in ascending layer
  order: vLLM sorts the aux layer ids) -> the condition, here ``W_c`` (``w_c.weight``);
- ``forward(input_ids, positions, hidden_states)`` -> ``(post-norm, pre-norm)`` hidden states:
  ``hidden_states`` is the condition, either ``W_c(taps)`` or the drafter's own previous pre-norm
  state (the chain's later steps), exactly as in training; the post-norm state goes to
  ``compute_logits``, the pre-norm one is fed back;
- ``compute_logits``: the LM head, scattered into the target vocabulary through ``d2t`` when the
  drafter has a reduced draft vocabulary (``-inf`` elsewhere);
- ``embed_input_ids``, ``load_weights``; ``has_own_embed_tokens`` / ``has_own_lm_head`` are set so
  that vLLM never swaps in the target's embedding (it would when the shapes match, and the Osprey
  embedding is the aligned backbone's, not the target's).

Each layer: ``x + attn([input_layernorm(x) ; cond_norm(c)])`` then ``+ mlp(post_attention_layernorm)``,
with vLLM's own attention (its KV cache, rotary, GQA) on a q/k/v projection of width 2D. The layer
prefixes continue after the target's layers (``model.layers.{num_target_layers + i}``) so their KV
cache entries never collide with the target's. Llama and Qwen2 families (q/k/v bias); Qwen3's q/k
norms are not implemented here (the export refuses them).

Registered by :func:`osprey_train.drafters.osprey.vllm_plugin.register` (entry point
``vllm.general_plugins``). Legend: L taps, Dt target hidden, D drafter hidden, V target vocab,
Vd draft vocab.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import QKVParallelLinear, ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaAttention, LlamaMLP
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

from osprey_train.drafters.osprey.vllm_plugin import OSPREY_VLLM_ARCH, vllm_weight_name

__all__ = ["Eagle3OspreyForCausalLM"]


class OspreyVLLMLayer(nn.Module):
    """One conditioned decoder layer on vLLM's attention."""

    def __init__(self, vllm_config: VllmConfig, config, prefix: str) -> None:
        super().__init__()
        family = config.osprey_drafter["family"]
        d = config.hidden_size
        qkv_bias = family == "qwen2" or bool(config.attention_bias)
        o_bias = bool(config.attention_bias) and family != "qwen2"
        self.self_attn = LlamaAttention(
            config=config, hidden_size=d, num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
            quant_config=None, bias=qkv_bias, bias_o_proj=o_bias, cache_config=vllm_config.cache_config,
            prefix=f"{prefix}.self_attn")
        # the projection reads [z ; c]: twice the hidden width
        self.self_attn.qkv_proj = QKVParallelLinear(
            2 * d, self.self_attn.head_dim, self.self_attn.total_num_heads, self.self_attn.total_num_kv_heads,
            bias=qkv_bias, quant_config=None, prefix=f"{prefix}.self_attn.qkv_proj")
        self.mlp = LlamaMLP(hidden_size=d, intermediate_size=config.intermediate_size, hidden_act="silu",
                            quant_config=None, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(d, eps=config.rms_norm_eps)
        self.cond_norm = RMSNorm(d, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        zc = torch.cat([self.input_layernorm(x), self.cond_norm(cond)], dim=-1)
        x = x + self.self_attn(positions=positions, hidden_states=zc)
        return x + self.mlp(self.post_attention_layernorm(x))


class OspreyVLLMBody(nn.Module):
    """``model.*``: embedding, layers, final norm (the drafter's HF names)."""

    def __init__(self, vllm_config: VllmConfig, config, start_layer: int, prefix: str) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                   prefix=f"{prefix}.embed_tokens")
        self.layers = nn.ModuleList(
            OspreyVLLMLayer(vllm_config, config, prefix=f"{prefix}.layers.{start_layer + i}")
            for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Eagle3OspreyForCausalLM(Eagle3LlamaForCausalLM):
    """The Osprey drafter behind vLLM's EAGLE-3 proposer (see the module docstring).

    A subclass of vLLM's EAGLE-3 Llama class only because the proposer checks the draft model's
    class (``isinstance`` in ``llm_base_proposer.propose``, vLLM 0.32): none of its construction or
    weights is used (``__init__`` starts from ``nn.Module``), and every method the proposer calls is
    defined here.
    """

    # Both always come from the checkpoint: never replaced by the target's.
    has_own_embed_tokens = True
    has_own_lm_head = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)   # not the EAGLE-3 body: see the class docstring
        spec = vllm_config.speculative_config
        assert spec is not None, "the Osprey drafter runs only as a speculative draft model"
        config = spec.draft_model_config.hf_config
        self.config = config
        target_layers = vllm_config.model_config.get_total_num_hidden_layers()
        config.target_layer_count = target_layers  # vLLM's draft-relative layer_types indexing
        self.model = OspreyVLLMBody(vllm_config, config, target_layers, prefix="model")
        self.w_c = ReplicatedLinear(config.target_hidden_size * len(config.eagle_aux_hidden_state_layer_ids),
                                    config.hidden_size, bias=False, params_dtype=vllm_config.model_config.dtype,
                                    return_bias=False, prefix="w_c")
        self.draft_vocab_size = int(config.draft_vocab_size)
        self.vocab_size = int(config.vocab_size)
        self.lm_head = ParallelLMHead(self.draft_vocab_size, config.hidden_size, prefix="lm_head")
        self.logits_processor = LogitsProcessor(self.draft_vocab_size)
        if self.draft_vocab_size != self.vocab_size:
            self.draft_id_to_target_id = nn.Parameter(torch.zeros(self.draft_vocab_size, dtype=torch.long),
                                                      requires_grad=False)
        else:
            self.draft_id_to_target_id = None

    def embed_input_ids(self, input_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.w_c(hidden_states)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        cond = hidden_states.to(x.dtype)
        for layer in self.model.layers:
            x = layer(positions, x, cond)
        return self.model.norm(x), x

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = self.logits_processor(self.lm_head, hidden_states)
        if self.draft_id_to_target_id is None or logits is None:
            return logits
        targets = torch.arange(self.draft_vocab_size, device=logits.device) + self.draft_id_to_target_id
        full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        full[:, targets] = logits
        return full

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            target, shard = vllm_weight_name(name)
            if target is None:
                continue
            if target not in params:
                raise ValueError(f"Osprey drafter checkpoint tensor {name!r} has no parameter {target!r} "
                                 f"in {OSPREY_VLLM_ARCH}")
            param = params[target]
            loader = getattr(param, "weight_loader", default_weight_loader)
            if shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
            loaded.add(target)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"Osprey drafter checkpoint lacks {missing}")
        return loaded

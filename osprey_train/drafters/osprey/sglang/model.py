"""SGLang external model class serving the Osprey drafter as an EAGLE-3-style draft model.

Stock SGLang drafts only with single-stream extra layers (``LlamaForCausalLMEagle3``); the Osprey
drafter has N source-family layers, each reading the condition through extra q/k/v columns. This
module provides that model class for SGLang's external-model mechanism:

    SGLANG_EXTERNAL_MODEL_PACKAGE=osprey_train.drafters.osprey.sglang python -m sglang.launch_server \\
        --model-path TARGET --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path EXPORTED_DIR (osprey export --format sglang) \\
        --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4

SGLang imports every module of that package and registers each ``EntryClass``; config.json of the
export names ``architectures: [OspreyDrafterForCausalLM]``. Everything that touches SGLang is
import-guarded: without SGLang this module imports fine and defines no ``EntryClass``.

Runtime contract (as for SGLang's EAGLE-3 draft models): ``forward_batch.spec_info.hidden_states``
is either the target's concatenated taps (width num_taps*Dt -> projected by W_c) or the drafter's
own previous pre-norm hidden state (width D); the model returns logits plus that pre-norm hidden
state as the auxiliary state for the next draft step. The class adds nothing to what SGLang feeds
it: SGLang's draft extend pairs the target's states ``h_0..h_{n-1}`` with the left-shifted ids
``[x_1..x_{n-1}, verified]`` at positions ``0..n-1``, exactly the layout the drafter was trained in
(:mod:`osprey_train.ttt.layout`; no ``(x_0, zeros)`` slot anywhere). ``set_embed`` is a no-op: the Osprey
embedding is the aligned backbone embedding in the drafter's own hidden size, not the target's.
A drafter with a reduced draft vocabulary has ``draft_vocab_size`` LM-head rows and a ``d2t``
tensor (offsets); ``load_weights`` turns it into ``hot_token_id = d2t + arange`` (draft id ->
target id), which SGLang's EAGLE worker applies to the drafted ids, as for ``LlamaForCausalLMEagle3``.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["map_weight_name", "checkpoint_names", "STACKED_PARAMS", "SGLANG_AVAILABLE"]

# (our tensor-name fragment, fused SGLang parameter fragment, shard id)
STACKED_PARAMS = (
    (".self_attn.q_proj.", ".self_attn.qkv_proj.", "q"),
    (".self_attn.k_proj.", ".self_attn.qkv_proj.", "k"),
    (".self_attn.v_proj.", ".self_attn.qkv_proj.", "v"),
    (".mlp.gate_proj.", ".mlp.gate_up_proj.", 0),
    (".mlp.up_proj.", ".mlp.gate_up_proj.", 1),
)


def map_weight_name(name: str) -> tuple[str, Any]:
    """Osprey checkpoint tensor name -> (SGLang parameter name, shard id or None).

    Pure Python so that the mapping is tested without SGLang (tests/train/export).
    """
    for ours, fused, shard in STACKED_PARAMS:
        if ours in name:
            return name.replace(ours, fused), shard
    return name, None


def checkpoint_names(param_names: Iterable[str]) -> set[str]:
    """The checkpoint tensor names that fill these SGLang parameters (a fused parameter needs each
    of its shards): what :func:`map_weight_name` maps onto them. Pure Python, as above."""
    out: set[str] = set()
    for name in param_names:
        shards = [name.replace(fused, ours) for ours, fused, _ in STACKED_PARAMS if fused in name]
        out.update(shards or [name])
    return out


try:  # pragma: no cover - exercised only where SGLang is installed (see tests marked sglang)
    import torch
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.linear import QKVParallelLinear, RowParallelLinear
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.layers.rotary_embedding import get_rope
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from sglang.srt.model_loader.weight_utils import default_weight_loader
    from sglang.srt.models.llama import LlamaMLP
    from torch import nn

    SGLANG_AVAILABLE = True
except ImportError:  # SGLang not installed: the module stays importable, no EntryClass.
    SGLANG_AVAILABLE = False


if SGLANG_AVAILABLE:  # pragma: no cover - needs SGLang + GPU

    def _tp_size() -> int:
        from sglang.srt.distributed import get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_world_size()

    class OspreySGLangAttention(nn.Module):
        """Conditioned GQA attention: qkv_proj reads [input_layernorm(x) ; cond_norm(c)] (width 2D)."""

        def __init__(self, od: dict, layer_id: int, quant_config: Any, prefix: str) -> None:
            super().__init__()
            hidden, heads, kv_heads, head_dim = (od["hidden_size"], od["num_attention_heads"],
                                                 od["num_key_value_heads"], od["head_dim"])
            tp = _tp_size()
            self.num_heads, self.num_kv_heads = heads // tp, max(1, kv_heads // tp)
            self.head_dim = head_dim
            self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
            qkv_bias = od["family"] == "qwen2" or od["attention_bias"]
            o_bias = od["attention_bias"] and od["family"] != "qwen2"
            self.qkv_proj = QKVParallelLinear(2 * hidden, head_dim, heads, kv_heads, bias=qkv_bias,
                                              quant_config=quant_config, prefix=f"{prefix}.qkv_proj")
            self.o_proj = RowParallelLinear(heads * head_dim, hidden, bias=o_bias, quant_config=quant_config,
                                            prefix=f"{prefix}.o_proj")
            if od["qk_norm"]:
                self.q_norm = RMSNorm(head_dim, eps=od["rms_norm_eps"])
                self.k_norm = RMSNorm(head_dim, eps=od["rms_norm_eps"])
            else:
                self.q_norm = self.k_norm = None
            self.rotary_emb = get_rope(head_dim, rotary_dim=head_dim, max_position=od["max_position_embeddings"],
                                       base=od["rope_theta"], rope_scaling=od["rope_scaling"])
            self.attn = RadixAttention(self.num_heads, head_dim, head_dim ** -0.5, num_kv_heads=self.num_kv_heads,
                                       layer_id=layer_id, prefix=f"{prefix}.attn")

        def forward(self, positions, x_in, forward_batch):
            qkv, _ = self.qkv_proj(x_in)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            if self.q_norm is not None:
                q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
                k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
            q, k = self.rotary_emb(positions, q, k)
            out = self.attn(q, k, v, forward_batch)
            out, _ = self.o_proj(out)
            return out

    class OspreySGLangLayer(nn.Module):
        """One Osprey decoder layer (pre-norm residual, conditioned attention, SwiGLU MLP)."""

        def __init__(self, od: dict, layer_id: int, quant_config: Any, prefix: str) -> None:
            super().__init__()
            eps = od["rms_norm_eps"]
            self.input_layernorm = RMSNorm(od["hidden_size"], eps=eps)
            self.cond_norm = RMSNorm(od["hidden_size"], eps=eps)
            self.self_attn = OspreySGLangAttention(od, layer_id, quant_config, f"{prefix}.self_attn")
            self.post_attention_layernorm = RMSNorm(od["hidden_size"], eps=eps)
            self.mlp = LlamaMLP(od["hidden_size"], od["intermediate_size"], "silu", quant_config,
                                prefix=f"{prefix}.mlp")

        def forward(self, positions, x, cond, forward_batch):
            z = self.input_layernorm(x)
            c = self.cond_norm(cond)
            x = x + self.self_attn(positions, torch.cat([z, c], dim=-1), forward_batch)
            return x + self.mlp(self.post_attention_layernorm(x))

    class OspreySGLangBody(nn.Module):
        def __init__(self, od: dict, quant_config: Any, prefix: str) -> None:
            super().__init__()
            self.embed_tokens = VocabParallelEmbedding(od["vocab_size"], od["hidden_size"],
                                                       prefix=f"{prefix}.embed_tokens")
            self.layers = nn.ModuleList(OspreySGLangLayer(od, i, quant_config, f"{prefix}.layers.{i}")
                                        for i in range(od["num_layers"]))
            self.norm = RMSNorm(od["hidden_size"], eps=od["rms_norm_eps"])

    class OspreyDrafterForCausalLM(nn.Module):
        """The Osprey drafter as an SGLang EAGLE-3 draft model (see module docstring)."""

        def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
            super().__init__()
            self.config = config
            self.quant_config = quant_config
            od = dict(config.osprey_drafter)
            self.od = od
            taps_width = len(od["tap_layers"]["layer_ids"]) * od["target_hidden_size"]
            if taps_width == od["hidden_size"]:
                raise ValueError("Osprey drafter: num_taps*target_hidden_size equals hidden_size; SGLang's "
                                 "width test cannot tell target taps from the drafter's own hidden state")
            self.model = OspreySGLangBody(od, quant_config, "model")
            self.w_c = nn.Linear(taps_width, od["hidden_size"], bias=False)
            self.lm_head = ParallelLMHead(od["draft_vocab_size"], od["hidden_size"], quant_config=quant_config,
                                          prefix="lm_head")
            self.logits_processor = LogitsProcessor(config)
            self.capture_aux_hidden_states = True
            self.load_lm_head_from_target = False
            self.hot_token_id = None  # full target vocabulary: no draft->target map (set by a d2t tensor)

        def get_hot_token_id(self):
            return self.hot_token_id

        def get_embed_and_head(self):
            return self.model.embed_tokens.weight, self.lm_head.weight

        def set_embed(self, embed) -> None:
            """Keep our own (aligned, drafter-sized) embedding; the target's does not fit."""

        def set_embed_and_head(self, embed, head) -> None:
            """Keep our own embedding and LM head (see set_embed)."""

        @torch.no_grad()
        def forward(self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None, **_):
            x = self.model.embed_tokens(input_ids) if input_embeds is None else input_embeds
            cond = forward_batch.spec_info.hidden_states
            if cond.shape[-1] != self.od["hidden_size"]:
                cond = self.w_c(cond.to(self.w_c.weight.dtype))  # target taps -> condition
            if cond.shape[0] == 0:  # idle batch
                return self.logits_processor(input_ids, cond, self.lm_head, forward_batch, [cond])
            for layer in self.model.layers:
                x = layer(positions, x, cond, forward_batch)
            # Pre-norm hidden goes back as the next step's condition; the normed one to the head.
            return self.logits_processor(input_ids, self.model.norm(x), self.lm_head, forward_batch, [x])

        def load_weights(self, weights: Iterable[tuple[str, "torch.Tensor"]]) -> None:
            params = dict(self.named_parameters())
            seen: set[str] = set()
            for name, tensor in weights:
                seen.add(name)
                if name == "d2t":  # offsets of the draft vocabulary: draft id i -> target id i + d2t[i]
                    self.hot_token_id = tensor.long() + torch.arange(tensor.shape[0], device=tensor.device)
                    continue
                if name == "t2d":  # not used by SGLang
                    continue
                target, shard = map_weight_name(name)
                if target not in params:
                    raise ValueError(f"Osprey drafter: checkpoint tensor {name!r} has no parameter {target!r}")
                param = params[target]
                loader = getattr(param, "weight_loader", default_weight_loader)
                if shard is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard)
            # SGLang leaves a parameter no tensor reaches uninitialised: a truncated export would
            # serve garbage drafts (still lossless, so nothing else would notice)
            missing = sorted(checkpoint_names(params) - seen)
            if missing:
                raise ValueError(f"Osprey drafter: the checkpoint lacks {len(missing)} tensor(s) the model needs "
                                 f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); export the "
                                 "drafter again with `osprey export --format sglang`")

    EntryClass = [OspreyDrafterForCausalLM]

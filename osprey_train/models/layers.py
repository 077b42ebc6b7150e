"""Building blocks shared by the drafters: RMSNorm, rotary embedding, conditioned attention, MLP.

These re-implement the decoder layers of Llama, Qwen2 (q/k/v bias) and Qwen3 (per-head q/k
RMSNorm) with the same parameter names and the same arithmetic as transformers, so that a source
checkpoint's tensors copy 1:1 and a drafter whose extra columns are zero computes exactly what the
source layer computed (tested against transformers in tests/train/models/).

The one addition: ``ConditionedAttention`` projects q/k/v from the concatenation [x ; c] of the
layer's normed input x (width D) and a condition c (width D). Its weights have shape
(out, 2D): columns [:D] are the source model's projection, columns [D:] are the extra block that
Stage 3 zero-initialises.

Legend: B batch, T tokens, D hidden, H query heads, Hk key/value heads, d head dim, I MLP inner.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from osprey_train.models.attention import AttentionBackend
from osprey_train.models.config import DrafterConfig

__all__ = [
    "RMSNorm", "RotaryEmbedding", "rope_inv_freq", "apply_rotary", "ConditionedAttention", "SwiGLUMLP",
    "ROPE_INIT", "normal_init",
]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, then scaled by ``weight`` (init 1), as in HF Llama."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


# --------------------------------------------------------------------------------- rotary


def _default(dim: int, base: float, params: dict, max_pos: int, seq_len: int) -> tuple[torch.Tensor, float]:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0


def _linear(dim: int, base: float, params: dict, max_pos: int, seq_len: int) -> tuple[torch.Tensor, float]:
    inv_freq, _ = _default(dim, base, params, max_pos, seq_len)
    return inv_freq / float(params["factor"]), 1.0


def _dynamic(dim: int, base: float, params: dict, max_pos: int, seq_len: int) -> tuple[torch.Tensor, float]:
    # Dynamic NTK: the base grows once the sequence exceeds the original context. Stateless here:
    # seq_len is the largest position of the current call + 1 (HF caches the largest seen).
    factor = float(params["factor"])
    if seq_len > max_pos:
        base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return _default(dim, base, params, max_pos, seq_len)


def _llama3(dim: int, base: float, params: dict, max_pos: int, seq_len: int) -> tuple[torch.Tensor, float]:
    inv_freq, _ = _default(dim, base, params, max_pos, seq_len)
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


def _yarn(dim: int, base: float, params: dict, max_pos: int, seq_len: int) -> tuple[torch.Tensor, float]:
    original = float(params.get("original_max_position_embeddings") or max_pos)
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_pos / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        if params.get("mscale") and params.get("mscale_all_dim"):
            attention_factor = mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv_extra, inv_inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    inv_freq = inv_inter * (1 - extrapolation_weight) + inv_extra * extrapolation_weight
    return inv_freq, float(attention_factor)


# rope_type -> fn(dim, base, params, max_position_embeddings, seq_len) -> (inv_freq, attention_scaling)
ROPE_INIT = {"default": _default, "linear": _linear, "dynamic": _dynamic, "llama3": _llama3, "yarn": _yarn}


def rope_inv_freq(config: DrafterConfig, seq_len: int = 0) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (d/2,) and cos/sin scaling for ``config``'s rotary settings."""
    params = dict(config.rope_scaling or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    return ROPE_INIT[rope_type](config.head_dim, float(config.rope_theta), params,
                                config.max_position_embeddings, seq_len)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for given position ids (HF half-rotation layout)."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        inv_freq, self.attention_scaling = rope_inv_freq(config)
        self.dynamic = (config.rope_scaling or {}).get("rope_type") == "dynamic"
        # A plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies.
        self.inv_freq = inv_freq

    def forward(self, position_ids_BT: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq
        if self.dynamic:
            inv_freq, _ = rope_inv_freq(self.config, int(position_ids_BT.max()) + 1)
        inv_freq = inv_freq.to(device=position_ids_BT.device, dtype=torch.float32)
        freqs_BTh = position_ids_BT[..., None].float() * inv_freq
        emb_BTd = torch.cat((freqs_BTh, freqs_BTh), dim=-1)
        cos = emb_BTd.cos() * self.attention_scaling
        sin = emb_BTd.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x_BHTd: torch.Tensor, cos_BTd: torch.Tensor, sin_BTd: torch.Tensor) -> torch.Tensor:
    """Rotate q or k (B, H, T, d) by the position tables (B, T, d)."""
    cos, sin = cos_BTd[:, None], sin_BTd[:, None]
    return x_BHTd * cos + _rotate_half(x_BHTd) * sin


# --------------------------------------------------------------------------------- attention


class ConditionedAttention(nn.Module):
    """GQA self-attention whose q/k/v read [x ; c] (x: normed layer input, c: condition).

    Parameter names follow HF (q_proj, k_proj, v_proj, o_proj, q_norm, k_norm). ``cond_width`` is
    the width of c (0 = a plain source-family attention, no extra block).
    """

    def __init__(self, config: DrafterConfig, cond_width: int, *, input_width: int | None = None) -> None:
        super().__init__()
        self.config = config
        d_in = (input_width or config.hidden_size) + cond_width
        self.input_width = input_width or config.hidden_size
        self.cond_width = cond_width
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.qkv_bias
        self.q_proj = nn.Linear(d_in, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_in, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_in, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def extra_columns(self) -> list[torch.Tensor]:
        """The weight blocks that read c: q/k/v_proj.weight[:, input_width:] (views)."""
        return [p.weight[:, self.input_width:] for p in (self.q_proj, self.k_proj, self.v_proj)]

    def forward(self, layer_idx: int, x_BTD: torch.Tensor, cond_BTD: torch.Tensor | None,
                cos_sin: tuple[torch.Tensor, torch.Tensor], attention: AttentionBackend) -> torch.Tensor:
        inp = x_BTD if cond_BTD is None else torch.cat([x_BTD, cond_BTD], dim=-1)
        batch, length, _ = inp.shape
        q = self.q_proj(inp).view(batch, length, self.num_heads, self.head_dim)
        k = self.k_proj(inp).view(batch, length, self.num_kv_heads, self.head_dim)
        v = self.v_proj(inp).view(batch, length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q_BHTd, k_BHkTd, v_BHkTd = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = cos_sin
        q_BHTd, k_BHkTd = apply_rotary(q_BHTd, cos, sin), apply_rotary(k_BHkTd, cos, sin)
        out_BHTd = attention(layer_idx, q_BHTd, k_BHkTd, v_BHkTd)
        out_BTX = out_BHTd.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        return self.o_proj(out_BTX)


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), HF names gate_proj / up_proj / down_proj."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def normal_init(model: nn.Module, std: float = 0.02) -> None:
    """Random init of a drafter made of these blocks: linears and embeddings normal(0, std), norms 1
    (biases untouched; convert overwrites what it copies from the target or a backbone)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.Embedding):
            with torch.no_grad():
                module.weight.normal_(std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

"""The SGLang external class, run on CPU against minimal stand-ins for the SGLang layers it uses.

No SGLang here, so ``osprey_train/drafters/osprey/sglang/model.py`` is loaded under another module name
with fake ``sglang.*`` modules (installed only for this test) that implement the documented
semantics of the pieces it uses: fused QKV / gate-up linears with shard weight loaders, a
row-parallel linear, neox-style rotary (HF half rotation), causal attention over one sequence, an
RMSNorm, and a logits processor that returns logits plus the concatenated aux hidden states. The
exported checkpoint is loaded through the class's own ``load_weights`` and must reproduce the Osprey
drafter's logits and pre-norm hidden state, for a first step (target taps through W_c) and a
second step (its own hidden state as the condition), and, fed as SGLang's draft extend + decode
feed it (left-shifted ids), draft the chains of our offline drafting. What this cannot catch:
differences between these stand-ins and the real SGLang kernels (checked only by the
sglang-marked test on a GPU box).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.export import ExportConfig, run
from osprey_train.models import DrafterConfig, KVCacheAttention, save_drafter


def _fake_sglang() -> dict[str, types.ModuleType]:
    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    def default_weight_loader(param, tensor):
        param.data.copy_(tensor)

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    class _Linear(nn.Module):
        def __init__(self, d_in, d_out, bias):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(d_out, d_in))
            self.bias = nn.Parameter(torch.empty(d_out)) if bias else None

        def forward(self, x):
            return nn.functional.linear(x, self.weight, self.bias), None

    class QKVParallelLinear(_Linear):
        def __init__(self, hidden_size, head_size, total_num_heads, total_num_kv_heads, bias=False,
                     quant_config=None, prefix=""):
            q, kv = total_num_heads * head_size, total_num_kv_heads * head_size
            super().__init__(hidden_size, q + 2 * kv, bias)
            offsets = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}

            def loader(param, tensor, shard):
                start, size = offsets[shard]
                param.data[start:start + size].copy_(tensor)

            for p in self.parameters():
                p.weight_loader = loader

    class RowParallelLinear(_Linear):
        def __init__(self, d_in, d_out, bias=False, quant_config=None, prefix=""):
            super().__init__(d_in, d_out, bias)

    class LlamaMLP(nn.Module):
        def __init__(self, hidden, inter, act, quant_config=None, prefix=""):
            super().__init__()
            self.gate_up_proj = _Linear(hidden, 2 * inter, False)
            self.down_proj = _Linear(inter, hidden, False)
            self.inter = inter

            def loader(param, tensor, shard):
                param.data[shard * inter:(shard + 1) * inter].copy_(tensor)

            self.gate_up_proj.weight.weight_loader = loader

        def forward(self, x):
            gu, _ = self.gate_up_proj(x)
            out, _ = self.down_proj(nn.functional.silu(gu[..., :self.inter]) * gu[..., self.inter:])
            return out

    class Rope(nn.Module):
        def __init__(self, head_dim, base):
            super().__init__()
            self.head_dim = head_dim
            self.inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))

        def forward(self, positions, q, k):
            ang = positions[:, None].float() * self.inv
            cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
            half = self.head_dim // 2

            def rot(x):
                x = x.view(x.shape[0], -1, self.head_dim)
                x = x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin
                return x.reshape(x.shape[0], -1)

            return rot(q), rot(k)

    def get_rope(head_dim, rotary_dim, max_position, base, rope_scaling=None):
        assert rope_scaling is None
        return Rope(head_dim, base)

    class RadixAttention(nn.Module):
        """Causal attention over one sequence with a per-layer KV cache held in forward_batch."""

        def __init__(self, num_heads, head_dim, scaling, num_kv_heads, layer_id, prefix=""):
            super().__init__()
            self.h, self.hk, self.d, self.scaling, self.layer_id = num_heads, num_kv_heads, head_dim, scaling, layer_id

        def forward(self, q, k, v, forward_batch):
            cache = forward_batch.kv.setdefault(self.layer_id, [])
            cache.append((k, v))
            k_all, v_all = torch.cat([c[0] for c in cache]), torch.cat([c[1] for c in cache])
            t, s = q.shape[0], k_all.shape[0]
            qh = q.view(t, self.h, self.d).transpose(0, 1)
            kh = k_all.view(s, self.hk, self.d).transpose(0, 1).repeat_interleave(self.h // self.hk, 0)
            vh = v_all.view(s, self.hk, self.d).transpose(0, 1).repeat_interleave(self.h // self.hk, 0)
            scores = qh @ kh.transpose(-1, -2) * self.scaling
            allowed = torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]
            out = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vh
            return out.transpose(0, 1).reshape(t, self.h * self.d)

    class VocabParallelEmbedding(nn.Embedding):
        def __init__(self, num, dim, prefix=""):
            super().__init__(num, dim)

    class ParallelLMHead(nn.Module):
        def __init__(self, num, dim, quant_config=None, prefix=""):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(num, dim))

    class LogitsProcessor:
        def __init__(self, config):
            self.config = config

        def __call__(self, input_ids, hidden, lm_head, forward_batch, aux=None):
            return types.SimpleNamespace(next_token_logits=hidden @ lm_head.weight.T,
                                         hidden_states=torch.cat(aux, -1) if aux else None)

    pkgs = ["sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.model_loader", "sglang.srt.models"]
    mods = {name: module(name) for name in pkgs}
    mods.update({
        "sglang.srt.layers.layernorm": module("sglang.srt.layers.layernorm", RMSNorm=RMSNorm),
        "sglang.srt.layers.linear": module("sglang.srt.layers.linear", QKVParallelLinear=QKVParallelLinear,
                                           RowParallelLinear=RowParallelLinear),
        "sglang.srt.layers.logits_processor": module("sglang.srt.layers.logits_processor",
                                                     LogitsProcessor=LogitsProcessor),
        "sglang.srt.layers.radix_attention": module("sglang.srt.layers.radix_attention",
                                                    RadixAttention=RadixAttention),
        "sglang.srt.layers.rotary_embedding": module("sglang.srt.layers.rotary_embedding", get_rope=get_rope),
        "sglang.srt.layers.vocab_parallel_embedding": module(
            "sglang.srt.layers.vocab_parallel_embedding", ParallelLMHead=ParallelLMHead,
            VocabParallelEmbedding=VocabParallelEmbedding),
        "sglang.srt.model_loader.weight_utils": module("sglang.srt.model_loader.weight_utils",
                                                       default_weight_loader=default_weight_loader),
        "sglang.srt.models.llama": module("sglang.srt.models.llama", LlamaMLP=LlamaMLP),
        "sglang.srt.distributed": module("sglang.srt.distributed",
                                         get_tensor_model_parallel_world_size=lambda: 1),
    })
    return mods


@pytest.mark.parametrize("preset,draft_vocab", [("tiny", None), ("tiny-qwen3", None), ("tiny", 96)])
def test_external_class_reproduces_the_drafter(tmp_path, monkeypatch, preset, draft_vocab):
    """``draft_vocab``: an Osprey drafter with a reduced draft vocabulary (convert --draft-vocab); SGLang
    maps the drafted ids through the model's ``hot_token_id`` (EAGLE worker), as for EAGLE-3."""
    from safetensors.torch import load_file

    for name, mod in _fake_sglang().items():
        monkeypatch.setitem(sys.modules, name, mod)
    path = Path(__import__("osprey_train.drafters.osprey.sglang.model", fromlist=["x"]).__file__)
    spec = importlib.util.spec_from_file_location("_osprey_sglang_model_under_fakes", path)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    assert ext.SGLANG_AVAILABLE and ext.EntryClass[0].__name__ == "OspreyDrafterForCausalLM"

    torch.manual_seed(0)
    over = {} if draft_vocab is None else {"draft_vocab_size": draft_vocab}
    drafter = OspreyDrafter(DrafterConfig.from_name(preset, target_hidden_size=32, **over)).eval()
    if draft_vocab is not None:
        drafter.set_draft_vocab(torch.arange(384)[torch.randperm(384)[:draft_vocab]].sort().values)
    save_drafter(drafter, tmp_path / "d")
    out = run(ExportConfig(drafter=tmp_path / "d", format="sglang", out=tmp_path / "s", dtype="float32")).out
    config = types.SimpleNamespace(**json.loads((out / "config.json").read_text()))
    model = ext.OspreyDrafterForCausalLM(config).eval()
    model.load_weights(load_file(str(out / "model.safetensors")).items())
    model.set_embed(torch.zeros(3, 3))  # the engine offers the target's embedding: must be ignored
    if draft_vocab is None:
        assert model.hot_token_id is None and model.get_hot_token_id() is None
    else:
        assert torch.equal(model.hot_token_id, drafter.draft_to_target)
    to_target = (lambda i: i) if draft_vocab is None else (lambda i: int(model.hot_token_id[i]))

    cfg = drafter.config
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (6,), generator=g)
    taps = torch.randn(6, cfg.num_taps, cfg.target_hidden_size, generator=g)
    batch = types.SimpleNamespace(kv={}, spec_info=types.SimpleNamespace(hidden_states=taps.reshape(6, -1)))
    first = model(ids, torch.arange(6), batch)
    with torch.no_grad():
        cache = KVCacheAttention(cfg.num_layers)
        hidden = drafter.forward_hidden(ids[None], drafter.fuse_taps(taps[None]), torch.arange(6)[None], cache)
        torch.testing.assert_close(first.next_token_logits, drafter.logits(hidden)[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(first.hidden_states, hidden[0], rtol=1e-4, atol=1e-4)
        # next draft step: the model's own pre-norm hidden state is the condition (width D, no W_c)
        nxt = torch.randint(0, cfg.vocab_size, (1,), generator=g)
        batch.spec_info.hidden_states = first.hidden_states[-1:]
        second = model(nxt, torch.tensor([6]), batch)
        ref = drafter.forward_hidden(nxt[None], hidden[:, -1:], torch.tensor([[6]]), cache)
        torch.testing.assert_close(second.next_token_logits, drafter.logits(ref)[0], rtol=1e-4, atol=1e-4)
    # Served as SGLang serves it: draft extend of the left-shifted ids [x_1..x_6] with the target's
    # h_0..h_5 at positions 0..5, then decode steps: the class's chain equals our offline drafts
    # after x_0..x_6 are committed (slot 5).
    from osprey_train.evaluation.chain_draft import draft_all_positions

    tokens = torch.randint(0, cfg.vocab_size, (7,), generator=g)
    hidden = torch.randn(7, cfg.num_taps, cfg.target_hidden_size, generator=g)
    batch = types.SimpleNamespace(kv={}, spec_info=types.SimpleNamespace(hidden_states=hidden[:6].reshape(6, -1)))
    out = model(tokens[1:], torch.arange(6), batch)
    chain = []
    for step in range(3):
        chain.append(to_target(int(out.next_token_logits[-1].argmax())))  # EAGLE worker: hot_token_id[topk]
        batch.spec_info.hidden_states = out.hidden_states[-1:]
        out = model(torch.tensor([chain[-1]]), torch.tensor([6 + step]), batch)
    assert chain == draft_all_positions(drafter, tokens, hidden, 3)[5].tolist()
    assert "sglang" in sys.modules  # the fakes are active only inside this test (monkeypatch undoes them)


def test_external_class_refuses_a_checkpoint_missing_a_tensor(tmp_path, monkeypatch):
    """SGLang leaves a parameter no tensor reaches uninitialised: the class names the missing one
    (the engine-level twin runs in tests/train/engines/test_sglang_exports.py)."""
    from safetensors.torch import load_file

    for name, mod in _fake_sglang().items():
        monkeypatch.setitem(sys.modules, name, mod)
    path = Path(__import__("osprey_train.drafters.osprey.sglang.model", fromlist=["x"]).__file__)
    spec = importlib.util.spec_from_file_location("_osprey_sglang_model_under_fakes", path)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    save_drafter(OspreyDrafter(DrafterConfig.from_name("tiny", target_hidden_size=32)), tmp_path / "d")
    out = run(ExportConfig(drafter=tmp_path / "d", format="sglang", out=tmp_path / "s")).out
    model = ext.OspreyDrafterForCausalLM(types.SimpleNamespace(**json.loads((out / "config.json").read_text())))
    state = load_file(str(out / "model.safetensors"))
    state.pop("model.layers.1.mlp.up_proj.weight")  # one shard of a fused parameter
    with pytest.raises(ValueError, match=r"lacks 1 tensor\(s\).*model\.layers\.1\.mlp\.up_proj\.weight"):
        model.load_weights(state.items())

"""Drafters against transformers: with zero extra columns an Osprey drafter IS the source model.

Covers Llama (incl. llama3 / yarn / linear / dynamic rotary scaling), Qwen2 (q/k/v bias) and
Qwen3 (q/k norm), the rotary tables against transformers' own, and the EAGLE-3 layer's wiring.
"""

from __future__ import annotations

import pytest
import torch

from osprey_data.errors import ModelError
from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.models import CausalAttention, DrafterConfig
from osprey_train.models.hf import copy_backbone_layers, drafter_config_from_hf
from osprey_train.models.layers import rope_inv_freq

ROPE_CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
}


def _hf_model(family: str, rope: dict | None = None, max_pos: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
               "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    cfg_cls, model_cls = classes[family]
    rope_parameters = {"rope_theta": 5000.0, "rope_type": "default", **(rope or {})}
    config = cfg_cls(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=max_pos,
                     rms_norm_eps=1e-5, tie_word_embeddings=False, rope_parameters=rope_parameters)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():  # non-trivial norms and biases so that a wrong copy shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _drafter_from_hf(model):
    config = drafter_config_from_hf(model.config, where="test", vocab_size=97, draft_vocab_size=97,
                                    target_hidden_size=16)
    drafter = OspreyDrafter(config).eval()
    state = model.state_dict()
    with torch.no_grad():
        copy_backbone_layers(drafter.model.layers, state, where="test")
        drafter.model.embed_tokens.weight.copy_(state["model.embed_tokens.weight"])
        drafter.model.norm.weight.copy_(state["model.norm.weight"])
        drafter.lm_head.weight.copy_(state["lm_head.weight"])
    return drafter


@pytest.mark.parametrize("family,rope", [("llama", "default"), ("llama", "linear"), ("llama", "dynamic"),
                                         ("llama", "llama3"), ("llama", "yarn"), ("qwen2", "default"),
                                         ("qwen3", "default")])
def test_zero_extra_columns_reproduce_the_hf_source(family, rope):
    model = _hf_model(family, ROPE_CASES[rope], max_pos=16 if rope == "dynamic" else 64)
    drafter = _drafter_from_hf(model)
    drafter.zero_extra_columns()
    length = 24  # beyond 16 so dynamic/yarn/llama3 scaling matters
    ids = torch.randint(0, 97, (2, length), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(length)[None].expand(2, length)
    cond = torch.randn(2, length, 32) * 3  # arbitrary condition: must not matter
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        got = drafter(ids, cond, pos)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # and the condition does matter once the extra columns are non-zero
    with torch.no_grad():
        for block in drafter.extra_column_blocks():
            block.normal_(std=0.5)
        assert not torch.allclose(drafter(ids, cond, pos), expected, atol=1e-3)


@pytest.mark.parametrize("rope", ["default", "linear", "llama3", "yarn"])
def test_rotary_tables_match_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = _hf_model("llama", ROPE_CASES[rope])
    drafter_cfg = _drafter_from_hf(model).config
    ours, scale = rope_inv_freq(drafter_cfg)
    if rope == "default":
        theirs, their_scale = type(model.model.rotary_emb).compute_default_rope_parameters(model.config)
    else:
        theirs, their_scale = ROPE_INIT_FUNCTIONS[rope](model.config, "cpu")
    torch.testing.assert_close(ours, theirs.float())
    assert scale == pytest.approx(their_scale)


def test_qwen2_has_qkv_bias_and_no_o_bias():
    drafter = _drafter_from_hf(_hf_model("qwen2"))
    attn = drafter.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None


def test_eagle3_layer_wiring_matches_a_naive_reference():
    torch.manual_seed(0)
    model = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3")).eval()
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (1, 5))
    taps = torch.randn(1, 5, cfg.num_taps, cfg.target_hidden_size)
    pos = torch.arange(5)[None]
    with torch.no_grad():
        cond = model.fuse_taps(taps)
        torch.testing.assert_close(cond, taps.reshape(1, 5, -1) @ model.fc.weight.T)
        got = model.forward_hidden(ids, cond, pos, CausalAttention())
        layer = model.midlayer

        def rms(x, w):
            return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

        x = torch.cat([rms(model.embed_tokens(ids), layer.input_layernorm.weight),
                       rms(cond, layer.hidden_norm.weight)], -1)
        a = layer.self_attn
        q = (x @ a.q_proj.weight.T).view(1, 5, 4, 16).transpose(1, 2)
        k = (x @ a.k_proj.weight.T).view(1, 5, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        v = (x @ a.v_proj.weight.T).view(1, 5, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, 16, 2).float() / 16))
        ang = torch.cat([pos[0, :, None] * inv] * 2, -1)

        def rot(t):
            return t * ang.cos() + torch.cat([-t[..., 8:], t[..., :8]], -1) * ang.sin()

        s = rot(q) @ rot(k).transpose(-1, -2) / 4.0
        s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(1, 5, 64) @ a.o_proj.weight.T
        h = cond + o
        mlp = layer.mlp
        hn = rms(h, layer.post_attention_layernorm.weight)
        h = h + (torch.nn.functional.silu(hn @ mlp.gate_proj.weight.T) * (hn @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    torch.testing.assert_close(got, h, rtol=1e-5, atol=1e-5)
    assert model.logits(got).shape == (1, 5, cfg.draft_vocab_size)
    assert not model.embed_tokens.weight.requires_grad


def test_two_layer_eagle3_is_the_midlayer_then_a_plain_llama_layer():
    """The parameter-matched control: midlayer output -> one uncondition Llama decoder layer."""
    torch.manual_seed(0)
    cfg = DrafterConfig.from_name("tiny-eagle3", num_layers=2)
    model = Eagle3Drafter(cfg).eval()
    one = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3")).eval()
    assert set(model.state_dict()) - set(one.state_dict()) == {
        f"layers.0.{n}" for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                  "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                  "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "mlp.down_proj.weight")}
    one.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("layers.")})
    ids = torch.randint(0, cfg.vocab_size, (1, 6))
    cond = torch.randn(1, 6, cfg.hidden_size)
    pos = torch.arange(6)[None]
    with torch.no_grad():
        got = model.forward_hidden(ids, cond, pos, CausalAttention())
        h = one.forward_hidden(ids, cond, pos, CausalAttention())
        layer = model.layers[0]

        def rms(x, w):
            return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

        a = layer.self_attn
        x = rms(h, layer.input_layernorm.weight)
        q = (x @ a.q_proj.weight.T).view(1, 6, 4, 16).transpose(1, 2)
        k = (x @ a.k_proj.weight.T).view(1, 6, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        v = (x @ a.v_proj.weight.T).view(1, 6, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, 16, 2).float() / 16))
        ang = torch.cat([pos[0, :, None] * inv] * 2, -1)

        def rot(t):
            return t * ang.cos() + torch.cat([-t[..., 8:], t[..., :8]], -1) * ang.sin()

        s = rot(q) @ rot(k).transpose(-1, -2) / 4.0
        s = s.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
        h = h + (s.softmax(-1) @ v).transpose(1, 2).reshape(1, 6, 64) @ a.o_proj.weight.T
        hn = rms(h, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        h = h + (torch.nn.functional.silu(hn @ mlp.gate_proj.weight.T) * (hn @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    torch.testing.assert_close(got, h, rtol=1e-5, atol=1e-5)


def test_fuse_taps_shape_error_names_expected_shape():
    model = OspreyDrafter(DrafterConfig.from_name("tiny"))
    with pytest.raises(ModelError, match="num_taps"):
        model.fuse_taps(torch.randn(1, 2, 4, 64))


def test_config_round_trip_and_validation():
    from osprey_data.errors import ConfigError

    config = DrafterConfig.from_name("tiny", rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert DrafterConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="unknown field"):
        DrafterConfig.from_dict({**config.to_dict(), "hiden_size": 3})
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        DrafterConfig.from_name("tiny", num_key_value_heads=3)
    with pytest.raises(ConfigError, match="eagle3 uses a Llama-style layer"):
        DrafterConfig.from_name("tiny-eagle3", family="qwen3", qk_norm=True)
    with pytest.raises(ConfigError, match="draft_vocab_size=400 exceeds"):
        DrafterConfig.from_name("tiny", draft_vocab_size=400)
    with pytest.raises(ConfigError, match="no drafter preset"):
        DrafterConfig.from_name("huge")
    legacy = DrafterConfig.from_name("tiny", rope_scaling={"type": "linear", "factor": 2.0})
    assert legacy.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_unsupported_source_families_are_model_errors():
    from types import SimpleNamespace

    from osprey_data.errors import ModelError
    from osprey_train.models.hf import hf_family, hf_rope

    with pytest.raises(ModelError, match="gemma3_text.*supported source families"):
        hf_family(SimpleNamespace(model_type="gemma3_text"), where="m")
    with pytest.raises(ModelError, match="hidden_act"):
        hf_family(SimpleNamespace(model_type="llama", hidden_act="gelu"), where="m")
    with pytest.raises(ModelError, match="sliding-window"):
        hf_family(SimpleNamespace(model_type="qwen2", layer_types=["sliding_attention"]), where="m")
    with pytest.raises(ModelError, match="per-layer-type rope"):
        hf_rope(SimpleNamespace(rope_parameters={"full_attention": {"rope_theta": 1.0}}), where="m")
    assert hf_rope(SimpleNamespace(rope_theta=500.0, rope_scaling={"type": "linear", "factor": 2.0}),
                   where="m") == (500.0, {"type": "linear", "factor": 2.0})


def test_osprey_draft_vocabulary_maps_lm_head_rows_to_target_ids(tmp_path):
    from osprey_train.models import load_drafter, save_drafter

    full = OspreyDrafter(DrafterConfig.from_name("tiny"))
    assert full.draft_to_target is None and "d2t" not in full.state_dict()  # checkpoints unchanged
    assert bool(full.target_to_draft_mask().all())
    with pytest.raises(ModelError, match="full target vocabulary"):
        full.set_draft_vocab(torch.arange(10))
    model = OspreyDrafter(DrafterConfig.from_name("tiny", draft_vocab_size=100)).eval()
    assert tuple(model.lm_head.weight.shape) == (100, 64) and model.model.embed_tokens.weight.shape[0] == 384
    ids = torch.arange(0, 300, 3)
    model.set_draft_vocab(ids)
    assert torch.equal(model.draft_to_target, ids) and int(model.target_to_draft_mask().sum()) == 100
    for bad, message in ((torch.arange(99), "expected"), (torch.arange(100).flip(0), "increasing"),
                         (torch.arange(300, 400), r"\[0, 384\)")):
        with pytest.raises(ModelError, match=message):
            model.set_draft_vocab(bad)
    taps = torch.randn(1, 5, 3, 64)
    logits = model(torch.randint(0, 384, (1, 5)), model.fuse_taps(taps))
    assert logits.shape == (1, 5, 100)
    save_drafter(model, tmp_path / "d")
    back = load_drafter(tmp_path / "d")
    assert torch.equal(back.draft_to_target, ids)
    torch.testing.assert_close(back(torch.zeros(1, 2, dtype=torch.long), back.fuse_taps(taps[:, :2])),
                               model(torch.zeros(1, 2, dtype=torch.long), model.fuse_taps(taps[:, :2])))

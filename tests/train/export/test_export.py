"""Export: round trips (identical weights and outputs) and the engines' tensor-name / id conventions."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from osprey_data.errors import ConfigError
from osprey_data.target_model import TapLayers, TargetIdentity
from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.drafters.osprey.sglang.model import checkpoint_names, map_weight_name
from osprey_train.export import ExportConfig, load_export, run
from osprey_train.models import CausalAttention, DrafterConfig, save_drafter

TARGET = TargetIdentity(name_or_path="/models/target", model_type="llama", config_hash="c", tokenizer_hash="t",
                        vocab_size=384, hidden_size=64, num_layers=6, dtype="float32")


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    e3 = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", target=TARGET, tap_layers=TapLayers(layer_ids=(2, 3, 4))))
    e3.set_draft_vocab(torch.arange(5, 384, 2)[:128])
    osp = OspreyDrafter(DrafterConfig.from_name("tiny-qwen3", target=TARGET, target_hidden_size=32))
    # an Osprey drafter with a reduced draft vocabulary (convert --draft-vocab)
    osp_dv = OspreyDrafter(DrafterConfig.from_name("tiny", target=TARGET, target_hidden_size=32, draft_vocab_size=100))
    osp_dv.set_draft_vocab(torch.arange(3, 384, 3)[:100])
    save_drafter(e3, root / "eagle3")
    save_drafter(osp, root / "osprey")
    save_drafter(osp_dv, root / "osprey-dv")
    (root / "osprey" / "alignment_stats.json").write_text("{}")
    return {"eagle3": (e3, root / "eagle3"), "osprey": (osp, root / "osprey"), "osprey-dv": (osp_dv, root / "osprey-dv")}


def _outputs(model):
    cfg = model.config
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg.vocab_size, (2, 7), generator=g)
    taps = torch.randn(2, 7, cfg.num_taps, cfg.target_hidden_size, generator=g)
    with torch.no_grad():
        h = model.forward_hidden(ids, model.fuse_taps(taps), torch.arange(7)[None].expand(2, 7), CausalAttention())
        return model.logits(h)


@pytest.mark.parametrize("arch,fmt", [("eagle3", "sglang"), ("eagle3", "vllm"), ("eagle3", "hf"),
                                      ("osprey", "sglang"), ("osprey", "hf"), ("osprey-dv", "sglang"),
                                      ("osprey-dv", "hf"), ("osprey-dv", "vllm")])
def test_round_trip_identical_weights_and_outputs(drafters, tmp_path, arch, fmt):
    model, folder = drafters[arch]
    result = run(ExportConfig(drafter=folder, format=fmt, out=tmp_path / fmt, dtype="float32"))
    assert result.arch == model.config.arch and result.dtype == "float32"
    back = load_export(result.out, fmt)
    assert type(back) is type(model) and back.config == model.config
    a, b = model.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert torch.equal(_outputs(model), _outputs(back))
    assert not list(tmp_path.glob(".*tmp*"))
    # no pickle anywhere: only JSON and safetensors files (and the sglang and vllm exports' serving README)
    assert {p.suffix for p in result.out.iterdir()} <= {".json", ".safetensors"} | ({".md"} if fmt != "hf" else set())


@pytest.mark.parametrize("fmt", ["sglang", "vllm", "hf"])
def test_exports_are_readable_by_other_users_under_umask_022(drafters, tmp_path, fmt):
    """A serving engine often runs as another user: folders 0755, files 0644 (not mkdtemp's 0700)."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        out = run(ExportConfig(drafter=drafters["eagle3"][1], format=fmt, out=tmp_path / fmt,
                               overwrite=True)).out
        out = run(ExportConfig(drafter=drafters["eagle3"][1], format=fmt, out=out, overwrite=True)).out
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
    assert [p.name for p in tmp_path.iterdir()] == [fmt]   # no temporary or set-aside folder left


def test_sglang_eagle3_layout_and_conventions(drafters, tmp_path):
    from safetensors.torch import load_file

    model, folder = drafters["eagle3"]
    out = run(ExportConfig(drafter=folder, format="sglang", out=tmp_path / "s")).out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is False
    assert cfg["draft_vocab_size"] == 128 and cfg["vocab_size"] == 384 and cfg["target_hidden_size"] == 64
    # SGLang adds 1 to these ids and captures the INPUT of that layer: HF hidden_states[i] -> i - 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    state = load_file(str(out / "model.safetensors"))
    # d2t is an OFFSET: SGLang's hot_token_id = d2t + arange
    assert torch.equal(state["d2t"] + torch.arange(128), model.draft_to_target)
    assert state["t2d"].dtype == torch.bool and int(state["t2d"].sum()) == 128
    # simulate SGLang's LlamaForCausalLMEagle3.load_weights naming (stacked qkv / gate_up, "model." prefix)
    params = {"model.embed_tokens.weight", "model.fc.weight", "model.norm.weight", "lm_head.weight",
              "model.midlayer.self_attn.qkv_proj.weight", "model.midlayer.self_attn.o_proj.weight",
              "model.midlayer.mlp.gate_up_proj.weight", "model.midlayer.mlp.down_proj.weight",
              "model.midlayer.input_layernorm.weight", "model.midlayer.hidden_norm.weight",
              "model.midlayer.post_attention_layernorm.weight"}
    loaded = set()
    for name in state:
        if "d2t" in name or "t2d" in name:
            continue
        mapped, _ = map_weight_name(name)
        loaded.add(mapped if mapped in params else f"model.{mapped}")
    assert loaded == params
    assert state["midlayer.self_attn.q_proj.weight"].shape == (64, 128)  # reads [embed ; hidden]
    assert state["fc.weight"].shape == (64, 3 * 64)


def test_vllm_speculators_layout_and_conventions(drafters, tmp_path):
    from safetensors.torch import load_file

    model, folder = drafters["eagle3"]
    out = run(ExportConfig(drafter=folder, format="vllm", out=tmp_path / "v", dtype="bfloat16")).out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 128
    assert cfg["norm_before_residual"] is False  # vLLM defaults to True when absent
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]  # vLLM: input of layer idx = HF index
    spec = cfg["speculators_config"]
    assert spec["verifier"]["name_or_path"] == "/models/target" and spec["proposal_methods"][0]["speculative_tokens"]
    layer = cfg["transformer_layer_config"]
    assert layer["num_hidden_layers"] == 1 and layer["vocab_size"] == 384 and layer["torch_dtype"] == "bfloat16"
    state = load_file(str(out / "model.safetensors"))
    assert state["fc.weight"].dtype == torch.bfloat16 and state["d2t"].dtype == torch.long
    assert torch.equal(torch.arange(128) + state["d2t"], model.draft_to_target)
    # vLLM's Eagle3LlamaForCausalLM.load_weights naming
    params = set()
    for name in state:
        if "t2d" in name:
            continue
        name = name.replace("d2t", "draft_id_to_target_id") if "d2t" in name else \
            (name if "lm_head" in name else "model." + name)
        params.add(map_weight_name(name)[0])
    assert params == {"draft_id_to_target_id", "lm_head.weight", "model.embed_tokens.weight", "model.fc.weight",
                      "model.norm.weight", "model.layers.0.self_attn.qkv_proj.weight",
                      "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
                      "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
                      "model.layers.0.hidden_norm.weight", "model.layers.0.post_attention_layernorm.weight"}
    # bf16 export reloads as the bf16 cast of the original
    back = load_export(out, "vllm")
    torch.testing.assert_close(back.fc.weight, model.fc.weight.to(torch.bfloat16), rtol=0, atol=0)


def test_osprey_sglang_export_matches_external_class_names(drafters, tmp_path):
    from safetensors.torch import load_file

    model, folder = drafters["osprey"]
    out = run(ExportConfig(drafter=folder, format="sglang", out=tmp_path / "o")).out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["OspreyDrafterForCausalLM"] and cfg["num_hidden_layers"] == 2
    assert cfg["osprey_drafter"] == model.config.to_dict()
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert (out / "alignment_stats.json").exists()
    state = load_file(str(out / "model.safetensors"))
    mapped = {map_weight_name(n) for n in state}
    names = {m for m, _ in mapped}
    for i in range(2):
        assert (f"model.layers.{i}.self_attn.qkv_proj.weight", "q") in mapped
        assert (f"model.layers.{i}.mlp.gate_up_proj.weight", 1) in mapped
        assert f"model.layers.{i}.cond_norm.weight" in names and f"model.layers.{i}.self_attn.q_norm.weight" in names
    assert {"w_c.weight", "lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"} <= names
    # what the class's load_weights demands back from its parameters is exactly the export's tensors
    # (a fused parameter needs each shard): a truncated export is refused, a whole one is not
    assert checkpoint_names(names) == set(state)
    assert "d2t" not in state and cfg["draft_vocab_size"] == 384  # full vocabulary: no map
    # a reduced draft vocabulary travels as EAGLE-3's does: int64 offsets d2t + bool t2d
    dv, dv_folder = drafters["osprey-dv"]
    out = run(ExportConfig(drafter=dv_folder, format="sglang", out=tmp_path / "dv", dtype="bfloat16")).out
    cfg = json.loads((out / "config.json").read_text())
    state = load_file(str(out / "model.safetensors"))
    assert cfg["draft_vocab_size"] == 100 and cfg["osprey_drafter"]["draft_vocab_size"] == 100
    assert state["lm_head.weight"].shape == (100, 64) and state["lm_head.weight"].dtype == torch.bfloat16
    assert state["d2t"].dtype == torch.int64 and torch.equal(state["d2t"] + torch.arange(100), dv.draft_to_target)
    assert state["t2d"].dtype == torch.bool and int(state["t2d"].sum()) == 100


def test_osprey_to_vllm_names_the_plugin_class_and_refuses_qwen3(drafters, tmp_path):
    from safetensors.torch import load_file

    from osprey_train.drafters.osprey.arch import VLLM_ARCHITECTURE
    from osprey_train.drafters.osprey.vllm_plugin import OSPREY_VLLM_ARCH, vllm_weight_name

    assert VLLM_ARCHITECTURE == OSPREY_VLLM_ARCH  # the exporter names the class the plugin registers
    model, folder = drafters["osprey-dv"]
    out = run(ExportConfig(drafter=folder, format="vllm", out=tmp_path / "v")).out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [OSPREY_VLLM_ARCH] and cfg["model_type"] == "llama"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(model.config.tap_layers.to_vllm())
    assert cfg["target_hidden_size"] == 32 and cfg["draft_vocab_size"] == 100 and cfg["num_hidden_layers"] == 2
    assert cfg["osprey_drafter"] == model.config.to_dict()
    state = load_file(str(out / "model.safetensors"))
    mapped = {vllm_weight_name(n) for n in state}
    assert (None, None) in mapped and ("draft_id_to_target_id", None) in mapped  # t2d skipped, d2t = vLLM's map
    assert ("model.layers.1.self_attn.qkv_proj.weight", "v") in mapped and ("model.layers.0.mlp.gate_up_proj.weight", 0) in mapped
    assert {"w_c.weight", "lm_head.weight", "model.embed_tokens.weight", "model.layers.0.cond_norm.weight"} <= \
        {m for m, _ in mapped}
    _, qwen3 = drafters["osprey"]
    with pytest.raises(ConfigError, match="q/k norms"):
        run(ExportConfig(drafter=qwen3, format="vllm", out=tmp_path / "q"))
    assert not (tmp_path / "q").exists()
    with pytest.raises(ConfigError, match="--format"):
        ExportConfig(drafter=folder, format="onnx", out=tmp_path / "x")
    with pytest.raises(ConfigError, match="--dtype"):
        ExportConfig(drafter=folder, format="hf", out=tmp_path / "x", dtype="int8")


def test_vllm_multi_layer_eagle3_names_layers_in_order_and_round_trips(tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(1)
    deep = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", target=TARGET, num_layers=3))
    deep.set_draft_vocab(torch.arange(5, 384, 2)[:128])
    save_drafter(deep, tmp_path / "deep")
    out = run(ExportConfig(drafter=tmp_path / "deep", format="vllm", out=tmp_path / "v", dtype="float32")).out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 3
    state = load_file(str(out / "model.safetensors"))
    # vLLM 0.32: layer 0 reads [embedding ; condition] (2D-wide q/k/v, hidden_norm), layers 1.. the residual stream
    assert state["layers.0.self_attn.q_proj.weight"].shape == (64, 128) and "layers.0.hidden_norm.weight" in state
    for i in (1, 2):
        assert torch.equal(state[f"layers.{i}.self_attn.q_proj.weight"], deep.layers[i - 1].self_attn.q_proj.weight)
        assert f"layers.{i}.hidden_norm.weight" not in state
    assert not any(k.startswith("midlayer.") for k in state)
    back = load_export(out, "vllm")
    assert back.config == deep.config and all(torch.equal(v, back.state_dict()[k]) for k, v in deep.state_dict().items())
    torch.testing.assert_close(_outputs(back), _outputs(deep), rtol=0, atol=0)


def test_full_vocabulary_eagle3_has_no_d2t_for_vllm(tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(2)
    full = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", target=TARGET, draft_vocab_size=384))
    full.set_draft_vocab(torch.arange(384))  # draft ids are sorted target ids: all of them = the identity
    save_drafter(full, tmp_path / "full")
    out = run(ExportConfig(drafter=tmp_path / "full", format="vllm", out=tmp_path / "v", dtype="float32")).out
    state = load_file(str(out / "model.safetensors"))
    assert "d2t" not in state and "t2d" not in state  # vLLM has no d2t parameter for a full draft vocabulary
    back = load_export(out, "vllm")
    torch.testing.assert_close(_outputs(back), _outputs(full), rtol=0, atol=0)


def test_engine_exports_refuse_what_the_engines_cannot_serve(tmp_path):
    from osprey_cli.main import cli

    two_taps = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", target=TARGET, tap_layers=TapLayers(layer_ids=(2, 4))))
    save_drafter(two_taps, tmp_path / "two")
    for fmt in ("sglang", "vllm"):
        with pytest.raises(ConfigError, match="exactly 3"):
            run(ExportConfig(drafter=tmp_path / "two", format=fmt, out=tmp_path / fmt))
        assert not (tmp_path / fmt).exists()
    run(ExportConfig(drafter=tmp_path / "two", format="hf", out=tmp_path / "hf"))  # our own format: fine
    deep = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", target=TARGET, num_layers=2))
    save_drafter(deep, tmp_path / "deep")
    with pytest.raises(ConfigError, match="has 2 layers; SGLang.s EAGLE-3 model runs exactly one"):
        run(ExportConfig(drafter=tmp_path / "deep", format="sglang", out=tmp_path / "deep-sglang"))
    run(ExportConfig(drafter=tmp_path / "deep", format="vllm", out=tmp_path / "deep-vllm"))  # vLLM 0.32 runs N layers
    run(ExportConfig(drafter=tmp_path / "deep", format="hf", out=tmp_path / "deep-hf"))
    # a drafter narrower than its target: vLLM 0.32 and SGLang both size fc from the target's width
    narrow = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", target=TARGET, target_hidden_size=48))
    save_drafter(narrow, tmp_path / "narrow")
    res = CliRunner().invoke(cli, ["export", "--drafter", str(tmp_path / "narrow"), "--format", "vllm",
                                   "--out", str(tmp_path / "v")])
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["target_hidden_size"] == 48 and cfg["transformer_layer_config"]["hidden_size"] == 64
    run(ExportConfig(drafter=tmp_path / "narrow", format="sglang", out=tmp_path / "s"))


def test_cli_export(drafters, tmp_path):
    from osprey_cli.main import cli

    _, folder = drafters["eagle3"]
    runner = CliRunner()
    res = runner.invoke(cli, ["export", "--drafter", str(folder), "--format", "sglang", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s" / "config.json").exists()
    res = runner.invoke(cli, ["export", "--drafter", str(folder), "--format", "sglang", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "exists" in res.output
    res = runner.invoke(cli, ["export", "--drafter", str(tmp_path / "none"), "--format", "hf", "--out",
                              str(tmp_path / "h")])
    assert res.exit_code == 2 and "no drafter config" in res.output


def test_sglang_model_module_imports_without_sglang():
    import importlib
    import sys

    mod = importlib.import_module("osprey_train.drafters.osprey.sglang.model")
    if "sglang" not in sys.modules:
        assert mod.SGLANG_AVAILABLE is False and not hasattr(mod, "EntryClass")


@pytest.mark.sglang
@pytest.mark.gpu
def test_sglang_registers_the_external_class():
    pytest.importorskip("sglang")
    import importlib
    import pkgutil

    import osprey_train.export as package

    found = {}
    for _, name, _ispkg in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(name)
        for cls in getattr(module, "EntryClass", []):
            found[cls.__name__] = cls
    assert "OspreyDrafterForCausalLM" in found


@pytest.mark.parametrize("arch", ["eagle3", "osprey-dv"])
def test_vllm_export_readme_has_the_launch_line(drafters, tmp_path, arch):
    import shlex

    model, folder = drafters[arch]
    out = run(ExportConfig(drafter=folder, format="vllm", out=tmp_path / "v")).out
    readme = (out / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("vllm serve "))
    words = shlex.split(line)
    assert words[:3] == ["vllm", "serve", model.config.target.name_or_path] and words[3] == "--speculative-config"
    assert json.loads(words[4]) == {"model": str(out.resolve()), "method": "eagle3", "num_speculative_tokens": 3}
    # an Osprey drafter is served by this package's plugin class: the README says to install it next to vLLM
    assert ("pip install -e ." in readme) == (arch == "osprey-dv")


@pytest.mark.parametrize("fmt", ["sglang", "vllm", "hf"])
def test_default_export_is_bfloat16_with_int64_d2t_and_says_so(drafters, tmp_path, fmt):
    """The engines serve bf16: by default floating tensors are bf16 (half the bytes), the id maps keep
    their integer / bool dtypes (a bf16 d2t would round draft ids above 256), the dtype is recorded."""
    from osprey_cli.main import cli
    from safetensors.torch import load_file

    model, folder = drafters["eagle3"]
    res = CliRunner().invoke(cli, ["export", "--drafter", str(folder), "--format", fmt, "--out", str(tmp_path / fmt)])
    assert res.exit_code == 0, res.output
    assert "(bfloat16 weights)" in res.output
    out = tmp_path / fmt
    state = load_file(str(out / "model.safetensors"))
    floats = {k: v.dtype for k, v in state.items() if v.is_floating_point()}
    assert floats and set(floats.values()) == {torch.bfloat16}, floats
    assert state["d2t"].dtype == torch.int64
    if fmt != "hf":
        assert state["t2d"].dtype == torch.bool
        assert torch.equal(state["d2t"] + torch.arange(128), model.draft_to_target)   # ids up to 383: exact
        cfg = json.loads((out / "config.json").read_text())
        assert cfg.get("torch_dtype", cfg.get("transformer_layer_config", {}).get("torch_dtype")) == "bfloat16"
    else:
        assert torch.equal(state["d2t"], model.draft_to_target)
    if fmt == "sglang":
        assert json.loads((out / "serving.json").read_text())["dtype"] == "bfloat16"
        assert "weights: bfloat16" in (out / "README.md").read_text()
    back = load_export(out, fmt)
    assert next(back.parameters()).dtype == torch.bfloat16
    torch.testing.assert_close(back.fc.weight, model.fc.weight.to(torch.bfloat16), rtol=0, atol=0)
    # --dtype float32 still gives the lossless export, recorded as such
    res = CliRunner().invoke(cli, ["export", "--drafter", str(folder), "--format", fmt, "--out", str(out),
                                   "--dtype", "float32", "--overwrite"])
    assert res.exit_code == 0 and "(float32 weights)" in res.output, res.output
    assert {v.dtype for v in load_file(str(out / "model.safetensors")).values() if v.is_floating_point()} == \
        {torch.float32}
    if fmt == "sglang":
        assert json.loads((out / "serving.json").read_text())["dtype"] == "float32"
    # bf16 is about half the bytes of float32
    assert (out / "model.safetensors").stat().st_size > 1.8 * sum(v.numel() * 2 for v in state.values()
                                                                   if v.is_floating_point())


def test_the_old_sglang_package_hands_sglang_the_same_class():
    """Exports written before the class moved name SGLANG_EXTERNAL_MODEL_PACKAGE=osprey_train.export:
    that package's module must import and carry the moved class's EntryClass (none without SGLang)."""
    import osprey_train.drafters.osprey.sglang.model as moved
    import osprey_train.export.sglang_model as old

    assert getattr(old, "EntryClass", None) is getattr(moved, "EntryClass", None)


@pytest.mark.parametrize("fmt", ["hf", "sglang", "vllm"])
def test_float16_export_refuses_a_finite_weight_it_cannot_hold(tmp_path, fmt):
    # issue 45: --dtype float16 turned a finite weight above 65504 into inf, exit 0
    from osprey_cli.main import cli

    torch.manual_seed(0)
    model = Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3", target=TARGET,
                                                  tap_layers=TapLayers(layer_ids=(2, 3, 4))))
    model.set_draft_vocab(torch.arange(5, 384, 2)[:128])
    with torch.no_grad():
        model.fc.weight[0, 0] = 70000.0
        model.fc.weight[0, 1] = 65510.0    # rounds to 65504: representable, not named
    save_drafter(model, tmp_path / "big")
    runner = CliRunner()
    res = runner.invoke(cli, ["export", "--drafter", str(tmp_path / "big"), "--format", fmt, "--dtype", "float16",
                              "--out", str(tmp_path / "f16")])
    assert res.exit_code == 2, res.output
    assert "'fc.weight' (largest |value| 70000)" in res.output and "float16's largest value (65504)" in res.output
    assert "--dtype bfloat16" in res.output and not (tmp_path / "f16").exists()
    res = runner.invoke(cli, ["export", "--drafter", str(tmp_path / "big"), "--format", fmt, "--dtype", "bfloat16",
                              "--out", str(tmp_path / "bf16")])
    assert res.exit_code == 0, res.output
    back = load_export(tmp_path / "bf16", fmt)
    assert torch.isfinite(back.fc.weight).all()


def test_cast_floating_refuses_what_float16_cannot_hold():
    from osprey_data.errors import ModelError
    from osprey_train.export.common import cast_floating

    state = {"a.weight": torch.tensor([1.0, -1e5]), "ids": torch.tensor([70000]), "b": torch.tensor([65519.0])}
    with pytest.raises(ModelError, match=r"'a.weight' \(largest \|value\| 100000\)"):
        cast_floating(state, torch.float16)
    del state["a.weight"]
    out = cast_floating(state, torch.float16)
    assert out["ids"].dtype == torch.long and float(out["b"]) == 65504.0
    assert cast_floating({"x": torch.tensor([float("inf")])}, torch.float16)["x"].isinf().all()

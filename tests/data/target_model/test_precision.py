"""Precision choice: ``auto`` follows the CPU's bf16 capability (mocked both ways), names are
checked, and prepacked bf16 linears compute what ``F.linear`` computes."""

from __future__ import annotations

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_data.target_model import precision as prec
from osprey_data.target_model import prepack_linears, resolve_precision


@pytest.fixture
def amx_cpu(monkeypatch):
    monkeypatch.delenv(prec.CAPABILITY_ENV, raising=False)
    monkeypatch.setattr(prec, "_cpu_flags", lambda: frozenset({"avx512f", "amx_bf16", "amx_tile"}))
    monkeypatch.setattr(prec, "_mkldnn_bf16_supported", lambda: True)


@pytest.fixture
def plain_cpu(monkeypatch):
    monkeypatch.delenv(prec.CAPABILITY_ENV, raising=False)
    monkeypatch.setattr(prec, "_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(prec, "_mkldnn_bf16_supported", lambda: True)


def test_auto_on_a_bf16_cpu(amx_cpu):
    assert prec.cpu_bf16_capable()
    p = resolve_precision("auto", "cpu")
    assert (p.name, p.weights, p.autocast, p.prepack) == ("bfloat16", torch.bfloat16, False, True)
    t = resolve_precision("auto", "cpu", training=True)
    assert (t.name, t.weights, t.autocast) == ("bf16-autocast", torch.float32, True)
    with t.context():
        assert torch.is_autocast_enabled("cpu")


def test_auto_without_bf16_falls_back_to_float32(plain_cpu):
    assert not prec.cpu_bf16_capable()
    for training in (False, True):
        p = resolve_precision("auto", "cpu", training=training)
        assert (p.name, p.weights, p.autocast, p.prepack) == ("float32", torch.float32, False, False)
        with p.context():
            assert not torch.is_autocast_enabled("cpu")


def test_flags_without_onednn_bf16_fall_back(monkeypatch):
    monkeypatch.delenv(prec.CAPABILITY_ENV, raising=False)
    monkeypatch.setattr(prec, "_cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(prec, "_mkldnn_bf16_supported", lambda: False)
    assert resolve_precision("auto", "cpu").name == "float32"


def test_cuda_and_explicit_names(plain_cpu):
    assert resolve_precision("auto", "cuda:0").name == "bfloat16"
    assert not resolve_precision("bfloat16", "cuda").prepack  # oneDNN packing is for the CPU only
    assert resolve_precision("bf16-autocast", "cpu", training=True).autocast
    with pytest.raises(ConfigError, match="--precision must be one of"):
        resolve_precision("bf32", "cpu")
    with pytest.raises(ConfigError, match="train precision"):
        resolve_precision("bfloat16", "cpu", training=True, what="train precision")


def test_env_overrides_the_detection(amx_cpu, monkeypatch):
    monkeypatch.setenv(prec.CAPABILITY_ENV, "0")
    assert resolve_precision("auto", "cpu").name == "float32"
    monkeypatch.setenv(prec.CAPABILITY_ENV, "1")
    monkeypatch.setattr(prec, "_cpu_flags", lambda: frozenset())
    assert resolve_precision("auto", "cpu").name == "bfloat16"
    monkeypatch.setenv(prec.CAPABILITY_ENV, "yes")
    with pytest.raises(ConfigError, match="OSPREY_CPU_BF16"):
        resolve_precision("auto", "cpu")


def test_cpuinfo_flags_are_read(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_tile\n")
    monkeypatch.setattr(prec, "_CPUINFO", info)
    assert prec._cpu_flags() == {"fpu", "avx512_bf16", "amx_tile"}
    monkeypatch.setattr(prec, "_CPUINFO", tmp_path / "missing")
    assert prec._cpu_flags() == frozenset()


def test_cpu_description_names_the_model_and_the_bf16_kernels_it_selects(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512_bf16\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512_bf16\n")
    monkeypatch.setattr(prec, "_CPUINFO", info)
    desc = prec.cpu_description()
    assert desc["cpu"] == "AMD EPYC 9R14" and desc["amx"] is False and desc["avx512_bf16"] is True
    assert desc["cores"] >= 1
    info.write_text("flags\t\t: fpu amx_tile amx_bf16 avx512_bf16\n")   # no model line: unnamed, flags still read
    assert prec.cpu_description()["cpu"] is None and prec.cpu_description()["amx"] is True


@pytest.mark.skipif(not (prec._BF16_FLAGS[0] in prec._cpu_flags() or prec._BF16_FLAGS[1] in prec._cpu_flags()),
                    reason="needs a CPU with bf16 matrix instructions")
def test_prepacked_linears_match_f_linear():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 40, bias=False))
    model = model.to(torch.bfloat16).eval()
    x_BTD = torch.randn(2, 5, 48, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = model(x_BTD).float()
        assert prepack_linears(model) == 2
        for rows in (x_BTD, x_BTD[:1, :1]):  # a block of rows and the one-row decode step
            out = model(rows).float()
            assert out.shape == (*rows.shape[:-1], 40)
            torch.testing.assert_close(out, ref[: rows.shape[0], : rows.shape[1]], atol=3e-2, rtol=2e-2)
    # a trainable forward with grad enabled does not use the stale packed copy
    model[0].weight.data.zero_()
    model[0].bias.data.zero_()
    assert model[0](x_BTD).abs().max().item() == 0.0
    # float32 models are left alone
    assert prepack_linears(torch.nn.Linear(4, 4)) == 0

"""The peers' layouts used as benchmark baselines: sizes follow the shapes, fp8 per row round-trips."""

from __future__ import annotations

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_data.store.peer_layouts import (
    PEER_LAYOUTS, dequantize_fp8_per_row, fp8_per_row, read_peer_sample, write_peer_sample,
)

T, L, D = 12, 3, 64


def _sample(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(T, L, D, generator=g) * 3).to(torch.bfloat16)
    hidden[0, :, 5] = 3000.0    # an attention-sink outlier: per-row scaling must survive it
    return {"hidden_TLD": hidden, "last_TD": torch.randn(T, D, generator=g).to(torch.bfloat16),
            "token_ids": torch.arange(T, dtype=torch.int32), "loss_mask": torch.ones(T, dtype=torch.bool)}


@pytest.mark.parametrize("layout", PEER_LAYOUTS)
def test_each_layout_reads_back_the_taps_and_the_last_layer(tmp_path, layout):
    s = _sample()
    path = tmp_path / f"{layout}.safetensors"
    write_peer_sample(layout, path, **s)
    back = read_peer_sample(layout, path)
    want = torch.cat([s["hidden_TLD"], s["last_TD"][:, None]], dim=1)
    got = torch.cat([back["taps_TLD"], back["last_TD"][:, None]], dim=1)
    assert got.dtype == torch.bfloat16 and back["taps_TLD"].shape == (T, L, D)
    assert back["token_ids"].tolist() == list(range(T))
    if layout == "speculators-fp8":   # e4m3: 3 mantissa bits, so within 1/16 of each row's own values
        err = (got.float() - want.float()).abs()
        assert (err <= want.float().abs() / 16 + want.float().abs().amax(-1, keepdim=True) / 2 ** 9).all()
    else:
        assert torch.equal(got, want)


def test_file_sizes_follow_the_shapes(tmp_path):
    s = _sample()
    size = {}
    for layout in PEER_LAYOUTS:
        write_peer_sample(layout, tmp_path / f"{layout}.safetensors", **s)
        size[layout] = (tmp_path / f"{layout}.safetensors").stat().st_size
    hidden = T * (L + 1) * D
    # bf16 hidden + int64 ids (+ int64 mask for SpecForge), plus a small JSON header
    assert 0 < size["specforge"] - (2 * hidden + 16 * T) < 512
    assert 0 < size["speculators"] - (2 * hidden + 8 * T) < 512
    assert 0 < size["speculators-fp8"] - (hidden + 4 * T * (L + 1) + 8 * T) < 512


def test_fp8_scales_per_row_and_an_unknown_layout_is_refused(tmp_path):
    x = torch.tensor([[[1.0, -2.0], [0.0, 0.0]]])
    values, scale = fp8_per_row(x)
    assert scale[0, 0] == pytest.approx(2.0 / 448) and values.dtype == torch.float8_e4m3fn
    assert torch.equal(dequantize_fp8_per_row(values, scale).float(), x)   # zero rows stay zero, not NaN
    with pytest.raises(ConfigError, match="unknown peer layout 'eagle'"):
        write_peer_sample("eagle", tmp_path / "x.safetensors", **_sample())


def test_layout_bench_measures_a_real_store_in_every_layout(tmp_path, capsys):
    """benchmarks/layout_bench.py on a small store: every layout written and read back, its figures
    in table.md / results.json and one RESULT line; sizes in the order the layouts promise."""
    import importlib.util
    import json
    from pathlib import Path

    from tests.data.store.helpers import write_records

    write_records(str(tmp_path / "store"), range(12))
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "layout_bench.py"
    spec = importlib.util.spec_from_file_location("layout_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--store", str(tmp_path / "store"), "--quick", "--out", str(tmp_path / "out")]) == 0
    result = capsys.readouterr().out.strip().splitlines()[-1]
    assert result.startswith("RESULT ") and "ours_fp8_size_ratio=" in result
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    size = {name: row["size_vs_specforge"] for name, row in doc["layouts"].items()}
    assert set(size) == {"specforge", "speculators", "speculators-fp8", "ours bf16-blosc", "ours fp8"}
    assert size["ours fp8"] < size["ours bf16-blosc"] and size["speculators-fp8"] < size["speculators"]
    assert (tmp_path / "out" / "table.md").read_text().count("|") > 20

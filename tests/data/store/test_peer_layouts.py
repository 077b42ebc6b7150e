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

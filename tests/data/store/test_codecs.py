"""Hidden-state codecs against naive references: bf16 exactness, fp8 error bounds with outliers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from osprey_data.store import HIDDEN_CODECS
from osprey_data.store.codecs import FP8_MAX, bf16_bits_to_float32, fp8_error_bound, to_bf16_bits


def _massive(N=256, L=3, D=576, seed=0):
    """Hidden states shaped like SmolLM2's: median |h| ~2.2, two channels near 26,624."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, L, D)).astype(np.float32) * 3.2  # median |N(0, 3.2)| ~ 2.2
    x[:, :, 123] = 26624.0 * (1 + 0.01 * rng.standard_normal((N, L)))
    x[:, :, 400] = -3072.0
    x[::17, 0, 55] = 8000.0  # token-local spike in an otherwise ordinary channel
    return x


@pytest.mark.parametrize("name", ["bf16-blosc", "bf16"])
def test_bf16_bits_match_torch_rounding_and_are_lossless_for_bf16(name):
    x = np.random.default_rng(1).standard_normal((10, 3, 32)).astype(np.float32) * 100
    ref = torch.from_numpy(x).to(torch.bfloat16)
    bits = to_bf16_bits(x)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bf16_bits_to_float32(bits), ref.float().numpy())
    codec = HIDDEN_CODECS[name]
    parts = codec.encode(ref)
    assert torch.equal(codec.decode_torch(parts), ref)
    np.testing.assert_array_equal(codec.decode(parts), ref.float().numpy())


def test_fp8_ordinary_channel_error_within_bound():
    x = _massive()
    codec = HIDDEN_CODECS["fp8"]
    y = codec.decode(codec.encode(x))
    err = np.abs(y - x)
    bound = fp8_error_bound(x, codec.outliers)
    assert (err <= bound).all(), float((err - bound).max())
    ordinary = np.ones(x.shape[-1], bool)
    ordinary[[123, 400]] = False
    xo, eo = x[..., ordinary], err[..., ordinary]
    # relative RMS on ordinary channels (not a norm dominated by the 26k channel)
    rel_rms = np.sqrt((eo**2).mean()) / np.sqrt((xo**2).mean())
    assert rel_rms < 0.05, rel_rms
    # outlier channels are kept at bf16 precision
    assert (err[..., 123] <= np.abs(x[..., 123]) * 2**-8 + 1e-6).all()
    assert (err[..., 400] == 0).all()  # -3072 is exactly representable in bf16


def test_fp8_beats_naive_per_token_scale_on_small_values():
    x = _massive()
    codec = HIDDEN_CODECS["fp8"]
    ours = np.abs(codec.decode(codec.encode(x)) - x)
    # naive: one scale per (token, tap) sized for the massive channel pushes ordinary values
    # into fp8's subnormal range, where small ones lose most of their precision
    t = torch.from_numpy(x)
    s = t.abs().amax(-1, keepdim=True) / FP8_MAX
    naive = np.abs(((t / s).to(torch.float8_e4m3fn).float() * s).numpy() - x)
    small = np.abs(x) < 0.5
    small[..., [123, 400]] = False
    ours_rel = (ours[small] / np.abs(x[small])).mean()
    naive_rel = (naive[small] / np.abs(x[small])).mean()
    assert ours_rel < 0.04 and naive_rel > 5 * ours_rel, (ours_rel, naive_rel)


def test_fp8_edge_cases_zero_rows_and_torch_output():
    codec = HIDDEN_CODECS["fp8"]
    x = np.zeros((4, 2, 16), np.float32)
    x[1] = 1.5
    y = codec.decode(codec.encode(x))
    np.testing.assert_array_equal(y, x)
    out = codec.decode_torch(codec.encode(torch.from_numpy(x).to(torch.bfloat16)))
    assert out.dtype == torch.bfloat16 and out.shape == (4, 2, 16)
    parts = codec.encode(x)
    assert parts[""].dtype == np.uint8 and parts["_scale"].shape == (4, 2)
    assert parts["_outlier_idx"].shape == (4, 2, 8)


@pytest.mark.parametrize("name", sorted(HIDDEN_CODECS))
def test_codec_contract(name):
    """Every codec: declared parts match encode's output, decoding is row-sliceable, dtypes."""
    codec = HIDDEN_CODECS[name]
    x = _massive(N=40, L=2, D=512, seed=3)
    parts = codec.encode(x)
    specs = {p.suffix: p for p in codec.parts(2, 512)}
    assert set(parts) == set(specs)
    for suffix, arr in parts.items():
        assert arr.dtype == np.dtype(specs[suffix].dtype)
        assert arr.shape == (40, *specs[suffix].per_row_shape)
    full = codec.decode(parts)
    assert full.dtype == np.float32 and full.shape == x.shape
    sliced = codec.decode({k: v[7:19] for k, v in parts.items()})
    np.testing.assert_array_equal(sliced, full[7:19])
    t = codec.decode_torch(parts)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == x.shape
    np.testing.assert_allclose(t.float().numpy(), full, rtol=2**-8, atol=0)
    # torch input of any float dtype is accepted
    np.testing.assert_array_equal(codec.decode(codec.encode(torch.from_numpy(x))), full)

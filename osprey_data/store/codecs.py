"""Hidden-state codecs (``HIDDEN_CODECS``): how tapped hidden states become stored arrays.

Legend: N tokens (rows of a shard), L taps, D hidden size, P outliers kept per (token, tap).

A codec turns ``hidden_NLD`` (any float dtype, numpy or torch) into one or more *parts*, each
a plain integer/float array with N leading rows that the shard writer stores as a Zarr array
named ``<array><suffix>`` (e.g. ``hidden``, ``hidden_scale``). Decoding is row-sliceable, so
the reader can fetch any token range without touching the rest.

* ``bf16-blosc`` (default) — lossless at bf16 precision (float32 inputs are rounded to
  nearest-even first; bf16 inputs are stored bit-exactly): the bf16 bit patterns as one uint16
  array, Blosc byte shuffle + zstd-1 in 1 MiB blocks. A reader decompresses whole chunks
  straight into its bfloat16 output: the stored values ARE the output's bits.
* ``bf16`` — the same values as two byte planes (sign/exponent byte zstd-compressed, mantissa
  byte stored raw), joined by two numpy passes on read; the same size, about half the read
  speed. Stores written before ``bf16-blosc`` existed use it, and stay readable and resumable.
* ``fp8``  — e4m3fn with a float32 scale per (token, tap) computed over the *ordinary*
  channels, and the P largest-magnitude channels of each (token, tap) kept exactly in bf16 with
  their channel index. LLM hidden states carry a few massive-activation channels (SmolLM2-135M:
  absmax 26,624 vs median |h| 2.2); a plain per-token scale sized for them would flush every
  ordinary channel to zero. Removing them per token first bounds the error of every ordinary
  element by ``2^-4 |x| + 2^-10 s`` (3 mantissa bits, subnormal step 2^-9·s) where
  ``s = max_ordinary|x| / 448`` — see :func:`fp8_error_bound`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

__all__ = [
    "HIDDEN_CODECS",
    "HiddenCodec",
    "PartSpec",
    "Bf16Codec",
    "Bf16BloscCodec",
    "Fp8Codec",
    "to_bf16_bits",
    "bf16_bits_to_float32",
    "fp8_error_bound",
]

FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass(frozen=True)
class PartSpec:
    """One stored array of a codec: suffix appended to the logical name, dtype, per-row shape,
    and the chunk compression (a key of ``zarrio.COMPRESSIONS``)."""

    suffix: str
    dtype: str
    per_row_shape: tuple[int, ...]
    compression: str = "blosc-zstd"


class HiddenCodec(Protocol):
    name: str
    direct_bits: bool
    """True when the codec's one part holds exactly the bf16 bits of the decoded values, so a
    reader may decompress chunks straight into a bfloat16 output."""

    def parts(self, L: int, D: int) -> list[PartSpec]: ...

    def encode(self, hidden_NLD: Any) -> dict[str, np.ndarray]: ...

    def decode(self, parts: dict[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray: ...

    def decode_torch(self, parts: dict[str, np.ndarray], out: Any = None) -> Any: ...


def to_bf16_bits(x: Any) -> np.ndarray:
    """bf16 bit patterns (uint16) of a numpy array or torch tensor, rounding to nearest-even."""
    import torch

    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    t = t.detach().to("cpu")
    if t.dtype != torch.bfloat16:
        t = t.to(torch.float32).to(torch.bfloat16)
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def bf16_bits_to_float32(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Exact float32 values of bf16 bit patterns (bf16 is the top half of float32).

    One pass: the uint16 patterns are widened and shifted straight into a uint32 view of the
    float32 result (``out`` when given), with no torch round trip and no temporary."""
    if out is None:
        out = np.empty(bits.shape, dtype=np.float32)
    np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


def _torch_bits_view(t) -> np.ndarray:
    """Writable uint16 numpy view of a contiguous bfloat16 CPU tensor's storage."""
    import torch

    return t.view(torch.int16).numpy().view(np.uint16)


_local = threading.local()


def _scratch_u16(shape: tuple[int, ...]) -> np.ndarray:
    """A per-thread reusable uint16 buffer (fresh multi-MB buffers cost page faults)."""
    n = int(np.prod(shape, dtype=np.int64))
    buf = getattr(_local, "u16", None)
    if buf is None or buf.size < n:
        buf = _local.u16 = np.empty(n, dtype=np.uint16)
    return buf[:n].reshape(shape)


def _check_out(out_shape: tuple[int, ...], shape: tuple[int, ...]) -> None:
    if tuple(out_shape) != tuple(shape):
        raise ValueError(f"decode: out has shape {tuple(out_shape)}, expected {tuple(shape)}")


def _bits_to_torch_bf16(bits: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


def _as_float32_torch(x: Any):
    import torch

    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    return t.detach().to("cpu", torch.float32)


class Bf16Codec:
    """bf16 bits, stored losslessly as two byte planes (see module docstring).

    The high byte (sign + 7 exponent bits + 1 mantissa bit) of activations is highly
    redundant; the low byte (7 mantissa bits) is noise. Storing them as separate arrays —
    ``_hi`` zstd-compressed, ``_lo`` through zstd's raw fast mode — gives the ratio of byte-shuffle + zstd over
    the whole value at about twice the decode speed, because zstd never chews on noise.
    """

    name = "bf16"
    direct_bits = False

    def parts(self, L: int, D: int) -> list[PartSpec]:
        return [PartSpec("_hi", "uint8", (L, D), "zstd"), PartSpec("_lo", "uint8", (L, D), "zstd-raw")]

    def encode(self, hidden_NLD: Any) -> dict[str, np.ndarray]:
        bits = to_bf16_bits(hidden_NLD)
        planes = bits.view(np.uint8).reshape(*bits.shape, 2)  # little-endian: [lo, hi]
        return {"_hi": np.ascontiguousarray(planes[..., 1]), "_lo": np.ascontiguousarray(planes[..., 0])}

    @staticmethod
    def _join(parts: dict[str, np.ndarray], bits: np.ndarray) -> np.ndarray:
        """bits = hi << 8 | lo, written into ``bits`` (uint16, two vectorised passes)."""
        np.left_shift(parts["_hi"], 8, out=bits, dtype=np.uint16)
        np.bitwise_or(bits, parts["_lo"], out=bits)
        return bits

    def decode(self, parts: dict[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        hi = parts["_hi"]
        if out is None:
            out = np.empty(hi.shape, dtype=np.float32)
        _check_out(out.shape, hi.shape)
        # whole-array byte interleaving (out[..., 2] = lo) is a strided store, ~10x slower
        # than these ufuncs; the uint16 temporary is chunk-sized, so it stays in cache
        return bf16_bits_to_float32(self._join(parts, _scratch_u16(hi.shape)), out=out)

    def decode_torch(self, parts: dict[str, np.ndarray], out: Any = None):
        import torch

        hi = parts["_hi"]
        if out is None:
            out = torch.empty(hi.shape, dtype=torch.bfloat16)
        _check_out(out.shape, hi.shape)
        self._join(parts, _torch_bits_view(out))  # the stored bits are the tensor's bits
        return out


class Bf16BloscCodec:
    """bf16 bits as one uint16 array, Blosc byte shuffle + zstd (see module docstring)."""

    name = "bf16-blosc"
    direct_bits = True

    def parts(self, L: int, D: int) -> list[PartSpec]:
        return [PartSpec("", "uint16", (L, D), "blosc-zstd-fast")]

    def encode(self, hidden_NLD: Any) -> dict[str, np.ndarray]:
        return {"": to_bf16_bits(hidden_NLD)}

    def decode(self, parts: dict[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        bits = parts[""]
        if out is not None:
            _check_out(out.shape, bits.shape)
        return bf16_bits_to_float32(bits, out=out)

    def decode_torch(self, parts: dict[str, np.ndarray], out: Any = None):
        import torch

        bits = parts[""]
        if out is None:
            out = torch.empty(bits.shape, dtype=torch.bfloat16)
        _check_out(out.shape, bits.shape)
        np.copyto(_torch_bits_view(out), bits)
        return out


@lru_cache(maxsize=1)
def _fp8_lut() -> np.ndarray:
    """float32 value of each of the 256 float8_e4m3fn bit patterns (NaN patterns -> NaN)."""
    import torch

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return codes.view(torch.float8_e4m3fn).to(torch.float32).numpy().copy()


class Fp8Codec:
    """fp8 e4m3fn with per-(token, tap) scales and P bf16 outlier channels per (token, tap)."""

    name = "fp8"
    direct_bits = False

    def __init__(self, outliers: int = 8) -> None:
        self.outliers = int(outliers)

    def _p(self, D: int) -> int:
        return max(0, min(self.outliers, D - 1))

    def parts(self, L: int, D: int) -> list[PartSpec]:
        specs = [PartSpec("", "uint8", (L, D), "zstd"), PartSpec("_scale", "float32", (L,))]
        P = self._p(D)
        if P:
            specs += [PartSpec("_outlier_idx", "uint16", (L, P)),
                      PartSpec("_outlier_val", "uint16", (L, P))]
        return specs

    def encode(self, hidden_NLD: Any) -> dict[str, np.ndarray]:
        import torch

        x_NLD = _as_float32_torch(hidden_NLD)
        D = x_NLD.shape[-1]
        if D > 65535:
            raise ValueError("fp8 codec stores channel indices as uint16; hidden size must be < 65536")
        P = self._p(D)
        abs_NLD = x_NLD.abs()
        out: dict[str, np.ndarray] = {}
        if P:
            idx_NLP = torch.topk(abs_NLD, P, dim=-1, sorted=False).indices.sort(dim=-1).values
            out["_outlier_idx"] = idx_NLP.to(torch.int32).numpy().astype(np.uint16)
            out["_outlier_val"] = to_bf16_bits(torch.gather(x_NLD, -1, idx_NLP))
            # the outliers are restored exactly on decode; exclude them from the scale
            abs_NLD = abs_NLD.scatter(-1, idx_NLP, 0.0)
            x_NLD = x_NLD.scatter(-1, idx_NLP, 0.0)
        scale_NL = abs_NLD.amax(dim=-1) / FP8_MAX
        scale_NL = torch.where(scale_NL > 0, scale_NL, torch.ones_like(scale_NL))
        q_NLD = (x_NLD / scale_NL[..., None]).clamp_(-FP8_MAX, FP8_MAX)
        out[""] = q_NLD.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        out["_scale"] = scale_NL.numpy().astype(np.float32)
        return out

    def decode(self, parts: dict[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        codes = parts[""]
        if out is None:
            out = np.empty(codes.shape, dtype=np.float32)
        _check_out(out.shape, codes.shape)
        # mode="clip" never clips (256 codes, 256 entries) but lets numpy skip its
        # bounds-check buffer when writing into ``out``
        x_NLD = np.take(_fp8_lut(), codes, out=out, mode="clip")
        x_NLD *= parts["_scale"][..., None]
        if "_outlier_idx" in parts:
            np.put_along_axis(x_NLD, parts["_outlier_idx"].astype(np.intp),
                              bf16_bits_to_float32(parts["_outlier_val"]), axis=-1)
        return x_NLD

    def decode_torch(self, parts: dict[str, np.ndarray], out: Any = None):
        import torch

        x = torch.from_numpy(self.decode(parts))
        if out is None:
            return x.to(torch.bfloat16)
        _check_out(out.shape, x.shape)
        return out.copy_(x)


def fp8_error_bound(x_NLD: np.ndarray, outliers: int) -> np.ndarray:
    """Elementwise bound on |decode(encode(x)) - x| for the ordinary channels of ``x``.

    Returns an array like ``x`` with the bound for every element (outlier positions get the
    bf16 rounding bound ``2^-8 |x|``). Used by tests and the benchmark.
    """
    x = np.asarray(x_NLD, dtype=np.float32)
    a = np.abs(x)
    D = x.shape[-1]
    P = max(0, min(outliers, D - 1))
    ordinary = np.ones_like(x, dtype=bool)
    if P:
        top = np.argpartition(a, D - P, axis=-1)[..., D - P:]
        np.put_along_axis(ordinary, top, False, axis=-1)
    s = np.where(ordinary, a, 0).max(axis=-1, keepdims=True) / FP8_MAX
    bound = a * 2.0**-4 + s * 2.0**-10
    return np.where(ordinary, bound * (1 + 1e-6) + 1e-30, a * 2.0**-8 * (1 + 1e-6))


HIDDEN_CODECS: dict[str, HiddenCodec] = {
    "bf16-blosc": Bf16BloscCodec(),
    "bf16": Bf16Codec(),
    "fp8": Fp8Codec(outliers=8),
}

"""Numeric precision of a model run: which weights dtype, whether matmuls autocast to bfloat16,
and whether linear layers use prepacked oneDNN weights — chosen from the machine's capabilities.

Names (``PRECISIONS``):

- ``float32``: float32 weights and matmuls (MKL GEMM on CPU).
- ``bfloat16``: bfloat16 weights. On a CPU with bf16 matrix units (AMX-BF16 / AVX512-BF16) the
  linear layers of an inference model are prepacked once (:func:`prepack_linears`): oneDNN's
  blocked weight layout, so a decode step does not re-lay-out every weight on every call (what
  ``F.linear`` on a plain bf16 weight does, and why a plain bf16 one-token step was no faster
  than float32 here; see docs/live.md "Precision").
- ``float16``: float16 weights (accelerators; kept for the builder's existing ``--dtype``).
- ``bf16-autocast``: float32 weights, matmuls in bfloat16 under ``torch.autocast`` — the
  training precision (float32 master weights and optimizer state).
- ``auto``: :func:`resolve_precision` picks by device and capability: bfloat16 weights for
  inference and ``bf16-autocast`` for training on CUDA or on a CPU with bf16 matrix units,
  float32 otherwise (a CPU without them emulates bf16 and runs slower than float32).

torch is imported inside the functions: the CLI imports this package on its ``--help`` path.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osprey_data.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = ["CAPABILITY_ENV", "PRECISIONS", "TRAIN_PRECISIONS", "Precision", "cpu_bf16_capable", "cpu_description",
           "resolve_precision", "prepack_linears"]

PRECISIONS: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16", "bf16-autocast")
TRAIN_PRECISIONS: tuple[str, ...] = ("auto", "float32", "bf16-autocast")
_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
_CPUINFO = Path("/proc/cpuinfo")
CAPABILITY_ENV = "OSPREY_CPU_BF16"
"""Set to ``0`` or ``1`` to override the detection (the test suite sets 0, so that ``auto`` means
the same on every CI machine)."""


def _cpu_flags() -> frozenset[str]:
    """The CPU feature flags of the first processor in ``/proc/cpuinfo`` (empty where unreadable)."""
    try:
        for line in _CPUINFO.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_description() -> dict[str, Any]:
    """This CPU's model name, core count and the flags that decide which bf16 kernels run (AMX tiles
    or AVX-512 BF16): figures computed on two machines can differ in rounding, so studies record it."""
    model = None
    try:
        for line in _CPUINFO.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = _cpu_flags()
    return {"cpu": model, "cores": os.cpu_count(), "amx": "amx_tile" in flags, "avx512_bf16": "avx512_bf16" in flags}


def _mkldnn_bf16_supported() -> bool:
    import torch

    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and probe is not None and probe())


def cpu_bf16_capable() -> bool:
    """True when this CPU has bf16 matrix instructions (``amx_bf16`` or ``avx512_bf16``) and torch's
    oneDNN can use them; without both, bf16 matmuls are emulated and slower than float32.
    ``$OSPREY_CPU_BF16`` (``0``/``1``) overrides the detection."""
    forced = os.environ.get(CAPABILITY_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ConfigError(f"${CAPABILITY_ENV} must be 0 or 1 (or unset to detect), got {forced!r}")
    return bool(_BF16_FLAGS[0] in _cpu_flags() or _BF16_FLAGS[1] in _cpu_flags()) and _mkldnn_bf16_supported()


@dataclass(frozen=True)
class Precision:
    """A resolved precision: what the model's weights are and how its matmuls run."""

    name: str
    """One of ``PRECISIONS`` other than ``auto``."""
    device_type: str
    """``cpu`` or ``cuda``: the autocast device."""

    @property
    def weights(self) -> "torch.dtype":
        """The dtype to load the weights in."""
        import torch

        return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(self.name, torch.float32)

    @property
    def autocast(self) -> bool:
        """Whether matmuls run under ``torch.autocast(dtype=bfloat16)``."""
        return self.name == "bf16-autocast"

    @property
    def prepack(self) -> bool:
        """Whether inference linears are prepacked for oneDNN (bf16 weights on CPU)."""
        return self.name == "bfloat16" and self.device_type == "cpu"

    def context(self) -> contextlib.AbstractContextManager:
        """The autocast context of this precision (a no-op unless ``bf16-autocast``)."""
        import torch

        if self.autocast:
            return torch.autocast(device_type=self.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def prepare(self, model: Any) -> Any:
        """Cast an inference model to the weights dtype and prepack its linears where that pays."""
        model.to(self.weights)
        if self.prepack:
            prepack_linears(model)
        return model


def resolve_precision(name: str, device: str, *, training: bool = False, what: str = "--precision") -> Precision:
    """Resolve ``auto`` for ``device`` (``cpu``/``cuda``/``cuda:N``) and check the name.

    ``training``: the choice for a trained model (float32 master weights): ``auto`` gives
    ``bf16-autocast`` where bf16 matmuls are fast, and bf16/fp16 weights are refused.
    """
    allowed = TRAIN_PRECISIONS if training else PRECISIONS
    if name not in allowed:
        raise ConfigError(f"{what} must be one of {allowed}, got {name!r}")
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    if name == "auto":
        fast = device_type == "cuda" or cpu_bf16_capable()
        name = ("bf16-autocast" if training else "bfloat16") if fast else "float32"
    return Precision(name=name, device_type=device_type)


# --- prepacked linears ------------------------------------------------------------------------


@functools.cache
def _has_packed_linear() -> bool:
    import torch

    return hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _packed_forward(self: Any, x: "torch.Tensor") -> "torch.Tensor":
    import torch

    if x.dtype != self._osprey_packed.dtype or torch.is_grad_enabled() and self.weight.requires_grad:
        return torch.nn.functional.linear(x, self.weight, self.bias)  # training or a foreign dtype
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self._osprey_packed, self.bias,
                                             "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


def prepack_linears(model: Any) -> int:
    """Give every bf16 CPU ``nn.Linear`` of an inference model a oneDNN-prepacked copy of its
    weight and a forward that uses it; returns how many were packed (0 when torch lacks the ops).

    The packed copy is taken now: weights changed later are not seen (inference only; a forward
    with grad enabled on a trainable weight falls back to ``F.linear``). Tied weights (an LM head
    sharing the embedding) get their own packed copy; ``.weight`` stays the shared parameter.
    """
    import torch

    if not _has_packed_linear():
        return 0
    packed = 0
    for module in model.modules():
        if type(module) is not torch.nn.Linear or module.weight.dtype != torch.bfloat16 \
                or module.weight.device.type != "cpu":
            continue
        with torch.no_grad():
            # batch-size hint 1: the decode step (one row) is the latency that matters
            module._osprey_packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), 1)
        module.forward = types.MethodType(_packed_forward, module)
        packed += 1
    return packed


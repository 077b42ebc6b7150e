"""Linear layers whose verify rows get exactly the bits a plain one-row decode step gets.

Why: greedy speculative decoding is lossless only if every row of a verify forward (``S + 1``
query rows) computes what a plain decode step (one row) computes, bit for bit; otherwise an exact
or near tie of the two best logits flips the greedy token and the output splits from plain
decoding. Row-exact attention (:mod:`row_exact_attention`) covers attention. The linears are the
other half, and whether a matmul kernel gives a row the same bits whatever the number of rows ``M``
depends on the CPU and the kernel (measured on SmolLM2-135M, docs/live.md "Losslessness"):

- bf16, oneDNN with AMX: every ``M`` in 1..17 gives a row the bits of the one-row call;
- bf16, oneDNN without AMX (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``, as on a CPU with AVX512-BF16
  but no AMX): ``M = 1`` takes another kernel than ``M >= 2`` (o_proj and down_proj split first);
  95 of 96 verify rows of the real model differed from the plain step's, and 5 of 10 speculative
  outputs split from plain decoding on a user's machine (issue 37);
- float32, MKL: ``M = 1`` (a GEMV) differs from ``M >= 2`` on every shape, and ``M = 16`` switches
  kernel again.

In every case measured, the rows of every ``M >= 2`` block up to the kernel's next switch equal
the rows of a 2-row call. So:

What: :func:`probe_linear` runs one module of each distinct linear (kernel, dtype, shape) on
random rows and finds (a) the *reference* call a single row goes through: itself (``1``) or
padded to 2 rows with a copy of itself (``2``), whichever more block sizes agree with, and (b) the
block sizes ``2..max_rows`` whose every row equals the reference bit for bit. The forward that
:func:`use_row_exact_linears` installs then pads one-row calls to the reference, and cuts any
block of at most ``max_rows`` rows into sizes proved exact (at worst single rows, each through the
reference call). A plain step and a verify row thus reach each linear through calls proved to give
them the same bits. Kernels do not branch on values, so a size that agrees on such rows (spread so that float32
sums round, which exposes any change of summation order) agrees on every input: the probe is a check of the machine's kernels, made on the model's own shapes and
thread count, not a sample of prompts. Blocks longer than ``max_rows`` (a prompt's prefill, the
same call in plain and speculative decoding) run unchanged.

Legend: B batch, T rows (tokens), Din / Dout features.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LinearPlan", "probe_linear", "use_row_exact_linears", "linear_plans"]


@dataclass(frozen=True)
class LinearPlan:
    """How calls to one linear are shaped so that every row gets the reference bits."""

    reference_rows: int
    """1: a single row is computed alone; 2: padded to two rows (a copy of itself), the kernel that
    blocks of two or more rows use."""
    exact_sizes: tuple[int, ...]
    """Block sizes in ``2..max_rows`` whose every row equals the reference call's, ascending."""
    max_rows: int
    """Blocks up to this many rows are shaped; longer ones (prefills) run as they come."""
    threads: int
    """``torch.get_num_threads()`` when probed (a kernel's blocking can depend on it)."""

    def chunks(self, rows: int) -> list[int]:
        """Block sizes (summing to ``rows``) a block of ``rows`` rows is computed in."""
        if rows > self.max_rows or rows in self.exact_sizes:
            return [rows]
        out, left = [], rows
        for size in sorted(self.exact_sizes, reverse=True):
            while left >= size:
                out.append(size)
                left -= size
        return out + [1] * left

    @property
    def native(self) -> bool:
        """True when the model's own calls already give every row the one-row bits (nothing to do)."""
        return self.reference_rows == 1 and len(self.exact_sizes) == self.max_rows - 1

    def describe(self) -> str:
        if self.native:
            return f"native (every block of 1..{self.max_rows} rows exact)"
        pad = "one-row calls padded to 2 rows" if self.reference_rows == 2 else "one-row calls as they come"
        missing = [m for m in range(2, self.max_rows + 1) if m not in self.exact_sizes]
        return f"{pad}; blocks of {_ranges(missing)} rows cut into exact sizes" if missing else \
            f"{pad}; every block of 2..{self.max_rows} rows exact"


def _ranges(values: list[int]) -> str:
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ",".join(parts)


def _pad_call(forward: Any, x_BTD: torch.Tensor) -> torch.Tensor:
    return forward(torch.cat([x_BTD, x_BTD], dim=-2))[..., :1, :]


@torch.no_grad()
def probe_linear(forward: Any, in_features: int, dtype: torch.dtype, device: torch.device, max_rows: int,
                 seed: int = 0) -> LinearPlan:
    """Find the reference call and the exact block sizes of one linear's ``forward`` (module call)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    # magnitudes spread over 2^-12..2^12: with N(0, 1) rows alone, bf16 products summed in float32
    # round nowhere, so any summation order gives the same bits and a kernel switch goes unseen
    scale_TD = torch.exp2(torch.randint(-12, 13, (max_rows, in_features), generator=gen).float())
    x_1TD = (torch.randn(1, max_rows, in_features, generator=gen) * scale_TD).to(device=device, dtype=dtype)
    alone = torch.cat([forward(x_1TD[:, r: r + 1]) for r in range(max_rows)], dim=1)
    padded = torch.cat([_pad_call(forward, x_1TD[:, r: r + 1]) for r in range(max_rows)], dim=1)
    agree: dict[int, list[int]] = {1: [], 2: []}
    for rows in range(2, max_rows + 1):
        block = forward(x_1TD[:, :rows])
        for ref, rows_ref in ((1, alone), (2, padded)):
            if torch.equal(block, rows_ref[:, :rows]):
                agree[ref].append(rows)
    reference = 1 if len(agree[1]) >= len(agree[2]) else 2
    return LinearPlan(reference_rows=reference, exact_sizes=tuple(agree[reference]), max_rows=max_rows,
                      threads=torch.get_num_threads())


def _shaped_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    plan: LinearPlan = self._osprey_row_plan
    inner = self._osprey_row_inner
    rows = x.shape[-2] if x.dim() >= 2 else 1
    if x.dim() < 2 or rows > plan.max_rows or x.numel() != rows * x.shape[-1]:
        return inner(x)  # a prefill, or a batch of several sequences: not a decode-shaped call
    x_1TD = x.reshape(1, rows, x.shape[-1])
    sizes = plan.chunks(rows)
    if sizes == [rows] and (rows > 1 or plan.reference_rows == 1):
        out = inner(x_1TD)
    else:
        outs, start = [], 0
        for size in sizes:
            part = x_1TD[:, start: start + size]
            outs.append(_pad_call(inner, part) if size == 1 and plan.reference_rows == 2 else inner(part))
            start += size
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _kernel_key(module: torch.nn.Linear) -> tuple:
    packed = getattr(module, "_osprey_packed", None) is not None
    return (packed, module.weight.dtype, module.weight.device.type, tuple(module.weight.shape), module.bias is not None)


def use_row_exact_linears(model: Any, max_rows: int) -> dict[str, LinearPlan]:
    """Probe every distinct linear of ``model`` for blocks of up to ``max_rows`` rows and install
    the shaped forward where a plan needs it; returns the plans by kernel description.

    Call it after the model's final dtype and prepacking (:meth:`Precision.prepare`): the probe
    measures the kernels the model will run. Calling it again with the same or a smaller
    ``max_rows`` and the same thread count keeps the existing plans.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    threads = torch.get_num_threads()
    plans: dict[tuple, LinearPlan] = {}
    for module in linears:
        old: LinearPlan | None = getattr(module, "_osprey_row_plan", None)
        if old is not None and (old.max_rows < max_rows or old.threads != threads):
            module.forward = module._osprey_row_inner  # re-probe below with the new bounds
            del module._osprey_row_plan, module._osprey_row_inner
            old = None
        key = _kernel_key(module)
        if old is not None:
            plans.setdefault(key, old)
            continue
        if key not in plans:
            plans[key] = probe_linear(module.forward, module.in_features, module.weight.dtype,
                                      module.weight.device, max_rows)
        plan = plans[key]
        if not plan.native:
            module._osprey_row_inner = module.forward
            module._osprey_row_plan = plan
            module.forward = types.MethodType(_shaped_forward, module)
    return {_describe_key(k): p for k, p in plans.items()}


def _describe_key(key: tuple) -> str:
    packed, dtype, device, shape, bias = key
    kind = "oneDNN prepacked" if packed else "F.linear"
    return f"{kind} {str(dtype).removeprefix('torch.')} {device} {shape[1]}->{shape[0]}{' +bias' if bias else ''}"


def linear_plans(model: Any) -> list[LinearPlan]:
    """The plans installed on ``model``'s linears (empty where every kernel is native)."""
    return [m._osprey_row_plan for m in model.modules() if getattr(m, "_osprey_row_plan", None) is not None]

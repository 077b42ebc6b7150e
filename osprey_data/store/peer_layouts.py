"""Our peers' on-disk layouts of the same features, for side-by-side size and speed figures (issue 33).

Neither peer ships a reader we could import without its training stack, and both formats are plain
safetensors files, one per sample, so they are written here from their public descriptions:

- **SpecForge-style** (``prepare_hidden_states``): ``aux_hidden_states`` (T, L*D) and
  ``hidden_states`` (T, D, the last layer's output, from which training recomputes the target's
  logits) in bfloat16, ``input_ids`` and ``loss_mask`` in int64;
- **speculators-style** (vLLM's ``ExampleHiddenStatesConnector``, which speculators' data
  generation drives): ``hidden_states`` (T, L+1, D) in bfloat16, the aux taps and the last layer
  stacked, and ``token_ids`` in int64;
- **speculators fp8** (its ``fp8`` hidden-states backend, speculators PR #1028): the same
  ``hidden_states`` in float8_e4m3fn with one float32 scale per token and layer row
  (``hidden_states_scale``, (T, L+1)), ``amax / 448``; read back as bfloat16.

Legend: T tokens of a sample, L taps, D hidden size.

Safetensors files are not compressed, so a peer file's size follows from its shapes alone; what a
peer would store in ``hidden_states`` (the last layer) can be any tensor of the right shape for a
size or speed figure. Never used to store features: these are benchmark baselines, with no
manifest, checksums or resume.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from osprey_data.errors import ConfigError

__all__ = ["PEER_LAYOUTS", "FP8_MAX", "fp8_per_row", "dequantize_fp8_per_row", "write_peer_sample",
           "read_peer_sample"]

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
"""448: the largest float8_e4m3fn value, the scale's denominator."""

PEER_LAYOUTS = ("specforge", "speculators", "speculators-fp8")


def fp8_per_row(x_TRD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float8_e4m3fn values and one float32 scale per (token, row): ``x ~= values * scale``."""
    x = x_TRD.float()
    scale_TR = (x.abs().amax(dim=-1) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return (x / scale_TR[..., None]).to(torch.float8_e4m3fn), scale_TR


def dequantize_fp8_per_row(values_TRD: torch.Tensor, scale_TR: torch.Tensor) -> torch.Tensor:
    return (values_TRD.float() * scale_TR[..., None]).to(torch.bfloat16)


def write_peer_sample(layout: str, path: Path, *, hidden_TLD: torch.Tensor, last_TD: torch.Tensor,
                      token_ids: torch.Tensor, loss_mask: torch.Tensor) -> None:
    """One sample in ``layout`` (one of :data:`PEER_LAYOUTS`) at ``path`` (a ``.safetensors`` file)."""
    T = hidden_TLD.shape[0]
    ids = token_ids.to(torch.int64).contiguous()
    if layout == "specforge":
        tensors = {"aux_hidden_states": hidden_TLD.to(torch.bfloat16).reshape(T, -1).contiguous(),
                   "hidden_states": last_TD.to(torch.bfloat16).contiguous(), "input_ids": ids,
                   "loss_mask": loss_mask.to(torch.int64).contiguous()}
    elif layout in ("speculators", "speculators-fp8"):
        stacked_TRD = torch.cat([hidden_TLD, last_TD[:, None, :]], dim=1).to(torch.bfloat16)
        if layout == "speculators":
            tensors = {"hidden_states": stacked_TRD.contiguous(), "token_ids": ids}
        else:
            values, scale = fp8_per_row(stacked_TRD)
            tensors = {"hidden_states": values.contiguous(), "hidden_states_scale": scale.contiguous(),
                       "token_ids": ids}
    else:
        raise ConfigError(f"unknown peer layout {layout!r}; one of {', '.join(PEER_LAYOUTS)}")
    save_file(tensors, str(path))


def read_peer_sample(layout: str, path: Path) -> dict[str, torch.Tensor]:
    """A sample written by :func:`write_peer_sample`, as that layout's trainer holds it: ``taps_TLD``
    and ``last_TD`` in bfloat16 (views of the file's tensors where the layout allows; the fp8 layout
    dequantized) and ``token_ids``."""
    t = load_file(str(path))
    if layout == "specforge":
        T, D = t["hidden_states"].shape
        return {"taps_TLD": t["aux_hidden_states"].view(T, -1, D), "last_TD": t["hidden_states"],
                "token_ids": t["input_ids"]}
    if layout == "speculators":
        stacked_TRD = t["hidden_states"]
    elif layout == "speculators-fp8":
        stacked_TRD = dequantize_fp8_per_row(t["hidden_states"], t["hidden_states_scale"])
    else:
        raise ConfigError(f"unknown peer layout {layout!r}; one of {', '.join(PEER_LAYOUTS)}")
    return {"taps_TLD": stacked_TRD[:, :-1], "last_TD": stacked_TRD[:, -1], "token_ids": t["token_ids"]}

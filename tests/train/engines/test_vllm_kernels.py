"""vLLM 0.32's CPU kernels, where they compute something other than what a checkpoint means.

Runs with ``pytest -m engine`` only, in the vLLM venv of ``engines/setup_vllm.sh`` (the same as
test_vllm_engine.py); without it the test fails, never skips.

**The grouped K-norm of DFlash's context keys.** vLLM's ``DFlashDraftModel`` projects the context
(the target's tapped states) to keys for all layers at once and normalises them with one
``ops.rms_norm`` call whose weight is the layers' ``k_norm`` weights stacked ``[layers, head_dim]``
(``qwen3_dflash.py``, ``_normalize_context_k``: "the weight is selected per layer by the outermost
index"). The CPU kernel ignores the layer index: every layer's context keys get layer 0's weight.
A drafter whose layers have different ``k_norm`` weights is then served as another drafter on CPU:
this is why vLLM's rounds differed from ours on one prompt of the backbone-DFlash engine test (a
flip at a logit margin of 0.0084). With per-layer calls patched into vLLM by hand (not shipped),
that test's rounds equal ours on 5 of 5 prompts (2026-12-07). CUDA's kernel is not checked here.

The test pins the kernel's behaviour: when a vLLM release fixes it, it fails, and then
``test_dflash_from_the_backbone_with_added_qk_norms_is_served_by_vllm_losslessly`` can demand every
round, docs/models.md can drop the caveat, and so can the note that DFlash's vLLM export writes.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from osprey_train.engines.engine_eval import engine_env
from osprey_train.engines.rig import find_rig

pytestmark = pytest.mark.engine

PROBE = """
import json, torch
from vllm import _custom_ops as ops
torch.manual_seed(0)
layers, ctx, heads, head_dim = 2, 5, 3, 64
k = torch.randn(layers, ctx, heads, head_dim)
w = torch.stack([torch.full((head_dim,), 0.5), torch.full((head_dim,), 2.0)]) + 0.1 * torch.randn(layers, head_dim)
out = torch.empty_like(k)
ops.rms_norm(out, k, w.contiguous(), 1e-5)
normed = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-5)
per_layer = torch.stack([normed[i] * w[i] for i in range(layers)])
print(json.dumps({"vs_per_layer": (out - per_layer).abs().max().item(),
                  "vs_layer0": (out - normed * w[0]).abs().max().item(),
                  "device": str(out.device)}))
"""


def test_vllm_cpu_rms_norm_applies_layer_0s_weight_to_every_layer_of_a_grouped_call():
    rig = find_rig("vllm")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    res = subprocess.run([str(rig.python), "-c", PROBE], capture_output=True, text=True, timeout=600,
                         env={**env, **engine_env(rig.venv, 1)})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["device"] == "cpu"
    # the per-layer answer is what the checkpoint means; the layers' weights differ by ~4x here
    assert got["vs_layer0"] < 1e-5, (got, "vLLM's CPU rms_norm now selects the weight per layer: see this "
                                          "module's docstring for what to update")
    assert got["vs_per_layer"] > 1.0, got

"""``osprey eval engine`` exports at its own ``--dtype`` (CPU; no engine needed).

``osprey export`` writes bf16 by default, while the engine evaluation's float32 parity runs (equal
counters, exact agreement) need a float32 export: the evaluation must pass its dtype through.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.engines.engine_eval import EngineEvalConfig, _exports
from osprey_train.models import DrafterConfig, save_drafter


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_engine_eval_exports_at_its_own_dtype(tmp_path, dtype):
    torch.manual_seed(0)
    save_drafter(Eagle3Drafter(DrafterConfig.from_name("tiny-eagle3")), tmp_path / "d")
    (tmp_path / "target").mkdir()
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    extra = {} if dtype is None else {"dtype": dtype}
    config = EngineEvalConfig(engine="vllm", drafter=tmp_path / "d", target=str(tmp_path / "target"),
                              inputs=(str(tmp_path / "p.jsonl"),), out=tmp_path / "run", progress=False, **extra)
    (tmp_path / "run").mkdir()
    [out] = _exports(config)
    want = {None: torch.float32, "bfloat16": torch.bfloat16}[dtype]   # the evaluation's default is float32
    floats = {v.dtype for v in load_file(str(out / "model.safetensors")).values() if v.is_floating_point()}
    assert floats == {want}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == str(want).removeprefix("torch.")

"""Optimizer settings and the learning-rate schedule are what the config says."""

from __future__ import annotations

import math

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.loop import train
from osprey_train.trainer.metrics import read_metrics
from osprey_train.trainer.optim import build_optimizer, lr_at, param_groups, warmup_steps
from tests.train.trainer.toy import ToyLM, ToyTask


def test_defaults_match_the_paper():
    cfg = OptimConfig()
    assert (cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay, cfg.grad_clip, cfg.warmup_ratio, cfg.schedule) == \
        (1e-4, (0.9, 0.95), 1e-8, 0.1, 1.0, 0.01, "cosine")


@pytest.mark.parametrize("bad", [dict(lr=0), dict(betas=(0.9, 1.0)), dict(eps=0), dict(weight_decay=-1),
                                 dict(grad_clip=-1), dict(warmup_ratio=1.0), dict(min_lr_ratio=2),
                                 dict(schedule="step")])
def test_bad_optim_config(bad):
    with pytest.raises(ConfigError):
        OptimConfig(**bad)


@pytest.mark.parametrize("bad", [dict(max_steps=0), dict(grad_accum=0), dict(log_every=0),
                                 dict(distributed="horovod"), dict(device="tpu"), dict(eval_every=-1)])
def test_bad_loop_config(bad, tmp_path):
    kw = dict(out_dir=tmp_path, max_steps=10)
    kw.update(bad)
    with pytest.raises(ConfigError):
        LoopConfig(**kw)


def test_optimizer_is_adamw_with_configured_settings_and_no_decay_policy():
    torch.manual_seed(0)
    model = ToyLM()
    cfg = OptimConfig(lr=2e-4, betas=(0.8, 0.9), eps=1e-7, weight_decay=0.05)
    opt = build_optimizer(model, None, cfg)
    assert isinstance(opt, torch.optim.AdamW)
    groups = {g["group"]: g for g in opt.param_groups}
    assert set(groups["decay"]["names"]) == {"blocks.0.1.weight", "blocks.0.3.weight", "head.weight"}
    # 1-D (biases, LayerNorm) and embedding tables are not decayed.
    assert "embed.weight" in groups["no_decay"]["names"]
    assert {"norm.weight", "norm.bias", "blocks.0.0.weight", "blocks.0.1.bias"} <= set(groups["no_decay"]["names"])
    assert groups["decay"]["weight_decay"] == 0.05 and groups["no_decay"]["weight_decay"] == 0.0
    for g in opt.param_groups:
        assert g["betas"] == (0.8, 0.9) and g["eps"] == 1e-7
    n_params = sum(1 for _ in model.parameters())
    assert sum(len(g["params"]) for g in opt.param_groups) == n_params


def test_fused_adamw_on_one_cpu_device_and_same_updates_as_foreach():
    torch.manual_seed(0)
    model, reference = ToyLM(dropout=0.0), ToyLM(dropout=0.0)
    reference.load_state_dict(model.state_dict())
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    opt = build_optimizer(model, None, cfg)
    assert opt.defaults["fused"] is True
    ref_params = dict(reference.named_parameters())
    ref_opt = torch.optim.AdamW([{"params": [ref_params[n] for n in g["names"]], "weight_decay": g["weight_decay"]}
                                 for g in opt.param_groups],
                                lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, foreach=True)
    for _ in range(4):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            m(torch.arange(8)[None]).float().square().mean().backward()
            o.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert set(opt.state_dict()["state"][0]) == set(ref_opt.state_dict()["state"][0])  # checkpoints unchanged


def test_tied_head_counts_as_embedding():
    model = ToyLM()
    model.head.weight = model.embed.weight
    groups = {g["group"]: g["names"] for g in param_groups(model, None, 0.1)}
    assert "head.weight" not in groups["decay"] and "embed.weight" in groups["no_decay"]


def test_cosine_schedule_with_linear_warmup():
    cfg = OptimConfig(lr=1e-3, warmup_ratio=0.01, min_lr_ratio=0.1)
    total = 1000
    assert warmup_steps(cfg, total) == 10
    assert [lr_at(s, cfg, total) for s in range(3)] == pytest.approx([1e-4, 2e-4, 3e-4])
    assert lr_at(9, cfg, total) == pytest.approx(1e-3)            # end of warmup: peak
    assert lr_at(10, cfg, total) == pytest.approx(1e-3)           # decay starts at the peak
    mid = 10 + (total - 1 - 10) / 2
    assert lr_at(int(mid), cfg, total) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (int(mid) - 10) / 989))))
    assert lr_at(total - 1, cfg, total) == pytest.approx(1e-4)   # min_lr_ratio at the last step
    lrs = [lr_at(s, cfg, total) for s in range(10, total)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))              # monotone decay


def test_warmup_at_least_one_step_and_other_schedules():
    assert warmup_steps(OptimConfig(warmup_ratio=0.01), 10) == 1
    assert warmup_steps(OptimConfig(warmup_ratio=0.0), 10) == 0
    lin = OptimConfig(lr=1.0, warmup_ratio=0.0, schedule="linear")
    assert [lr_at(s, lin, 5) for s in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    const = OptimConfig(lr=1.0, warmup_ratio=0.2, schedule="constant")
    assert [lr_at(s, const, 5) for s in range(5)] == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0])


def test_trainer_applies_schedule_and_clip(tmp_path):
    cfg = OptimConfig(lr=5e-3, warmup_ratio=0.25, grad_clip=1e-3)
    loop = LoopConfig(out_dir=tmp_path, max_steps=8, log_every=1, progress=True, device="cpu", plot=False)
    train(ToyTask(), loop, cfg)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["lr"] for r in records] == pytest.approx([lr_at(s, cfg, 8) for s in range(8)])
    assert all(r["grad_norm"] > 1e-3 for r in records)      # the reported norm is before clipping


def test_clipping_bounds_the_gradient_seen_by_the_optimizer(tmp_path):
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    norms = []

    def hook(optimizer, args, kwargs):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())

    handle = register_optimizer_step_pre_hook(hook)
    try:
        train(ToyTask(), LoopConfig(out_dir=tmp_path, max_steps=3, progress=False, device="cpu", plot=False),
              OptimConfig(grad_clip=1e-3))
    finally:
        handle.remove()
    assert len(norms) == 3 and all(n <= 1e-3 * (1 + 1e-4) for n in norms)

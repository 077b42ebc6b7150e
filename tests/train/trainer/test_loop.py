"""The training loop: exact resume, accumulation, eval/metrics/plot, final save, refusals."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from osprey_data.errors import CheckpointError, ConfigError, Interrupted, TrainingDivergedError
from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.loop import TrainResult, train
from osprey_train.trainer.metrics import read_metrics
from tests.train.trainer.toy import Crash, ToyTask


def _loop(out, **kw):
    # float32 pinned: these tests check float32 arithmetic (accumulation, bit-exact resume)
    base = dict(out_dir=out, max_steps=10, log_every=1, save_every=5, eval_every=5, progress=False, device="cpu",
                distributed="none", keep_checkpoints=0, plot=False, precision="float32")
    base.update(kw)
    return LoopConfig(**base)


OPTIM = OptimConfig(lr=3e-3, warmup_ratio=0.2)


def _weights(result: TrainResult) -> dict[str, torch.Tensor]:
    return load_file(str(result.final_dir / "model.safetensors"))


def test_resume_is_bit_exact(tmp_path):
    straight = train(ToyTask(), _loop(tmp_path / "a"), OPTIM)
    with pytest.raises(Crash):
        train(ToyTask(crash_at_step=7), _loop(tmp_path / "b"), OPTIM)
    assert (tmp_path / "b" / "checkpoints" / "step-5").is_dir()
    assert not (tmp_path / "b" / "final").exists()          # a crashed run has no final model
    task = ToyTask()
    resumed = train(task, _loop(tmp_path / "b", resume=True), OPTIM)
    assert resumed.resumed_from.name == "step-5"
    assert min(s for s, _, _ in task.batches_seen) == 5      # data resumes at the right step

    wa, wb = _weights(straight), _weights(resumed)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    oa = load_file(str(tmp_path / "a" / "checkpoints" / "step-10" / "optimizer.safetensors"))
    ob = load_file(str(tmp_path / "b" / "checkpoints" / "step-10" / "optimizer.safetensors"))
    assert oa.keys() == ob.keys() and all(torch.equal(oa[k], ob[k]) for k in oa)

    # Metrics of the resumed run equal the straight run's (records after step 5 of the crashed
    # attempt were dropped), except wall-clock derived fields.
    def losses(path):
        return [(r["kind"], r["step"], r.get("loss"), r.get("lr"), r.get("eval_loss"))
                for r in read_metrics(path / "metrics.jsonl")]
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    assert resumed.tokens_seen == straight.tokens_seen == 10 * 4 * 8
    assert straight.last_eval["eval_loss"] == resumed.last_eval["eval_loss"]


def test_dropout_rng_matters_for_resume(tmp_path):
    # Guard that the exact-resume test is meaningful: two different seeds diverge.
    a = train(ToyTask(), _loop(tmp_path / "a", max_steps=3, save_every=0, eval_every=0), OPTIM)
    b = train(ToyTask(), _loop(tmp_path / "b", max_steps=3, save_every=0, eval_every=0, seed=1), OPTIM)
    assert any(not torch.equal(x, y) for x, y in zip(_weights(a).values(), _weights(b).values()))


def test_grad_accum_matches_bigger_batch(tmp_path):
    # accum=2 over micro-batches of 4 == one batch of 8 (same sequences), up to float rounding.
    # Dropout off so both runs compute the same function.
    class Big(ToyTask):
        def batch(self, step, micro, rank, world_size):
            a = super().batch(step, 0, 0, 1)["ids"]
            b = super().batch(step, 1, 0, 1)["ids"]
            return {"ids": torch.cat([a, b]), "step": step}

    acc = train(ToyTask(dropout=0.0), _loop(tmp_path / "acc", grad_accum=2, max_steps=4, save_every=0), OPTIM)
    big = train(Big(dropout=0.0), _loop(tmp_path / "big", max_steps=4, save_every=0), OPTIM)
    for (name, x), y in zip(_weights(acc).items(), _weights(big).values()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)
    assert acc.tokens_seen == big.tokens_seen == 4 * 8 * 8


def test_outputs_metrics_plot_and_eval(tmp_path):
    result = train(ToyTask(), _loop(tmp_path, max_steps=30, log_every=5, eval_every=10, save_every=10,
                                    eval_at_start=True, keep_checkpoints=2, plot=True), OptimConfig(lr=1e-2))
    records = read_metrics(tmp_path / "metrics.jsonl")
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    eval_steps = [r["step"] for r in records if r["kind"] == "eval"]
    assert train_steps == [5, 10, 15, 20, 25, 30]
    assert eval_steps == [0, 10, 20, 30]
    assert [h["step"] for h in result.eval_history] == eval_steps
    assert records[-1]["eval_loss"] < records[0]["eval_loss"]             # it learned
    assert all(r["tokens_per_s"] > 0 for r in records if r["kind"] == "train")
    png = tmp_path / "metrics.png"
    assert result.plot_path == png and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step-20", "step-30"]                                  # keep_checkpoints=2
    assert json.loads((tmp_path / "final" / "config.json").read_text())["vocab"] == 32
    assert result.step == 30 and result.tokens_per_s > 0


def test_existing_run_needs_resume_flag(tmp_path):
    train(ToyTask(), _loop(tmp_path, max_steps=2, save_every=0, eval_every=0), OPTIM)
    with pytest.raises(ConfigError, match="--resume"):
        train(ToyTask(), _loop(tmp_path, max_steps=2, save_every=0, eval_every=0), OPTIM)


def test_resume_with_changed_settings_is_refused(tmp_path):
    with pytest.raises(Crash):
        train(ToyTask(crash_at_step=6), _loop(tmp_path), OPTIM)
    with pytest.raises(CheckpointError, match="optim"):
        train(ToyTask(), _loop(tmp_path, resume=True), OptimConfig(lr=1e-3, warmup_ratio=0.2))
    with pytest.raises(CheckpointError, match="max_steps"):
        train(ToyTask(), _loop(tmp_path, resume=True, max_steps=20), OPTIM)


def test_resume_without_checkpoint_is_an_error_unless_if_any(tmp_path):
    with pytest.raises(ConfigError, match="--resume: .* holds no complete checkpoint.*--resume-if-any"):
        train(ToyTask(), _loop(tmp_path, resume=True, max_steps=2, save_every=0, eval_every=0), OPTIM)
    result = train(ToyTask(), _loop(tmp_path, resume_if_any=True, max_steps=2, save_every=0, eval_every=0), OPTIM)
    assert result.resumed_from is None and result.step == 2
    again = train(ToyTask(), _loop(tmp_path / "x", resume_if_any=True, max_steps=2, save_every=0, eval_every=0),
                  OPTIM)
    assert again.step == 2
    # a checkpoint present: --resume-if-any continues it (here: nothing left to do)
    resumed = train(ToyTask(), _loop(tmp_path, resume_if_any=True, max_steps=2, save_every=0, eval_every=0), OPTIM)
    assert resumed.resumed_from.name == "step-2"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_checkpoints_the_finished_step_and_resume_is_exact(tmp_path, signum):
    # the handlers in place before (SIGINT is SIG_IGN in a job a non-interactive shell backgrounds)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    straight = train(ToyTask(), _loop(tmp_path / "a", save_every=0, eval_every=0), OPTIM)
    # a real signal to this process in the middle of step 3 (save_every=0: no periodic checkpoint)
    with pytest.raises(Interrupted, match=rf"interrupted by {signum.name} after step 4 of 10: checkpoint "
                                          rf".*step-4 kept; rerun the same command with --resume") as exc:
        train(ToyTask(signal_at_step=3, signum=signum), _loop(tmp_path / "b", save_every=0, eval_every=0), OPTIM)
    assert exc.value.exit_code == 128 + signum
    assert {s: signal.getsignal(s) for s in before} == before  # handlers restored
    assert [p.name for p in (tmp_path / "b" / "checkpoints").iterdir()] == ["step-4"]
    resumed = train(ToyTask(), _loop(tmp_path / "b", save_every=0, eval_every=0, resume=True), OPTIM)
    assert resumed.resumed_from.name == "step-4"
    wa, wb = _weights(straight), _weights(resumed)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_signal_during_evaluation_drops_it_and_keeps_the_step(tmp_path):
    with pytest.raises(Interrupted, match="after step 5 of 10: checkpoint .*step-5 kept"):
        train(ToyTask(signal_in_eval=True), _loop(tmp_path, save_every=0, eval_every=5), OPTIM)
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals == []   # the evaluation in progress was dropped, not half-written


def test_nan_loss_raises(tmp_path):
    with pytest.raises(TrainingDivergedError, match="step 3"):
        train(ToyTask(nan_at_step=2), _loop(tmp_path, max_steps=5, save_every=0, eval_every=0), OPTIM)


def test_gradient_checkpointing_hook(tmp_path):
    with pytest.raises(ConfigError, match="gradient_checkpointing"):
        train(ToyTask(), _loop(tmp_path, max_steps=1, gradient_checkpointing=True), OPTIM)

    class Hooked(ToyTask):
        called = 0

        def enable_gradient_checkpointing(self, model):
            Hooked.called += 1

    train(Hooked(), _loop(tmp_path / "h", max_steps=1, gradient_checkpointing=True), OPTIM)
    assert Hooked.called == 1


def test_trainable_parameters_are_respected(tmp_path):
    class Frozen(ToyTask):
        def trainable_parameters(self, model):
            return model.head.parameters()

    result = train(Frozen(dropout=0.0), _loop(tmp_path / "f", max_steps=3, save_every=0, eval_every=0), OPTIM)
    torch.manual_seed(0)
    init = ToyTask().build_model().state_dict()
    trained = _weights(result)
    assert torch.equal(trained["embed.weight"], init["embed.weight"])
    assert not torch.equal(trained["head.weight"], init["head.weight"])


@pytest.mark.gpu
def test_cuda_uses_bf16_autocast_and_fp32_master_weights(tmp_path):
    dtypes = []

    class Probe(ToyTask):
        def loss(self, model, batch):
            logits = model(batch["ids"][:, :-1])
            dtypes.append((logits.dtype, next(model.parameters()).dtype, batch["ids"].device.type))
            return super().loss(model, batch)

    result = train(Probe(), _loop(tmp_path, max_steps=3, device="cuda"), OPTIM)
    assert dtypes and all(d == (torch.bfloat16, torch.float32, "cuda") for d in dtypes)
    assert result.last_train["loss"] > 0 and _weights(result)["head.weight"].dtype == torch.float32


def test_cpu_trains_in_fp32(tmp_path):
    dtypes = []

    class Probe(ToyTask):
        def loss(self, model, batch):
            dtypes.append(model(batch["ids"][:, :-1]).dtype)
            return super().loss(model, batch)

    result = train(Probe(), _loop(tmp_path, max_steps=2, save_every=0, eval_every=0), OPTIM)
    assert dtypes == [torch.float32, torch.float32] and result.precision == "float32"


def test_metrics_plot_marks_short_runs_and_never_exponentiates_a_non_cross_entropy():
    """Issue #25: a 1-record distill run drew a blank metrics.png, and exp(summed TTT loss) was
    plotted as a perplexity (~1e17)."""
    import matplotlib.pyplot as plt

    from osprey_train.trainer.metrics import metrics_figure

    records = [{"kind": "train", "step": 1, "loss": 40.0, "acc_k0": 0.2, "acc_k1": 0.1}]
    fig = metrics_figure(records)   # distillation: no perplexity_of
    loss_ax, right_ax = fig.axes
    (line,) = loss_ax.get_lines()
    assert line.get_marker() not in (None, "None", "") and list(line.get_ydata()) == [40.0]
    assert sorted(line.get_label() for line in right_ax.get_lines()) == ["train acc_k0", "train acc_k1"]
    assert all(max(line.get_ydata()) <= 1.0 for line in right_ax.get_lines())
    plt.close(fig)
    fig = metrics_figure([{"kind": "train", "step": 1, "loss": 2.0, "ce": 1.0}], perplexity_of="ce")
    (ppl,) = fig.axes[1].get_lines()
    assert ppl.get_ydata()[0] == pytest.approx(2.718281828) and fig.axes[1].get_yscale() == "log"
    plt.close(fig)


def test_cpu_bf16_autocast_keeps_fp32_master_weights_and_records_it(tmp_path):
    from osprey_train.trainer.checkpoint import latest_checkpoint, read_trainer_state

    dtypes = []

    class Probe(ToyTask):
        def loss(self, model, batch):
            dtypes.append(model(batch["ids"][:, :-1]).dtype)
            return super().loss(model, batch)

    result = train(Probe(), _loop(tmp_path, max_steps=2, save_every=2, eval_every=0, precision="bf16-autocast"),
                   OPTIM)
    assert dtypes == [torch.bfloat16, torch.bfloat16] and result.precision == "bf16-autocast"
    assert _weights(result)["head.weight"].dtype == torch.float32
    assert read_trainer_state(latest_checkpoint(tmp_path / "checkpoints"))["precision"] == "bf16-autocast"


@pytest.mark.parametrize("flags, expected", [({"amx_bf16"}, "bf16-autocast"), ({"avx2"}, "float32")])
def test_auto_precision_follows_the_cpu(tmp_path, monkeypatch, flags, expected):
    from osprey_data.target_model import TRAIN_PRECISIONS
    from osprey_data.target_model import precision as prec
    from osprey_train.trainer.config import TRAIN_PRECISIONS as LOOP_PRECISIONS

    assert LOOP_PRECISIONS == TRAIN_PRECISIONS
    monkeypatch.delenv(prec.CAPABILITY_ENV, raising=False)
    monkeypatch.setattr(prec, "_cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(prec, "_mkldnn_bf16_supported", lambda: True)
    result = train(ToyTask(), _loop(tmp_path, max_steps=1, save_every=0, eval_every=0, precision="auto"), OPTIM)
    assert result.precision == expected

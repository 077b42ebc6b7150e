"""Stage 2 pretraining on a tiny corpus: learning, exact resume, DDP == single, CLI, bad inputs."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from osprey_cli.main import cli
from osprey_data.corpus import TokenizeCorpusConfig
from osprey_data.corpus import run as tokenize
from osprey_data.errors import CheckpointError, ConfigError, InputError
from osprey_train.stages.pretrain import PretrainConfig, PretrainTask, run
from osprey_train.trainer import LoopConfig, OptimConfig
from osprey_train.trainer.metrics import read_metrics
from tests.helpers.tiny import _CORPUS, make_tiny_llama, make_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_tokenizer_dir, tiny_tokenizer):
    tmp = tmp_path_factory.mktemp("pretrain")
    model_dir = make_tiny_llama(tmp / "model", tiny_tokenizer, num_layers=2, hidden_size=32)
    docs = [f"{_CORPUS[i % len(_CORPUS)]} {_CORPUS[(3 * i + 1) % len(_CORPUS)]}" for i in range(120)]
    (tmp / "docs.jsonl").write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
    tokenize(TokenizeCorpusConfig(tokenizer=str(model_dir), inputs=[tmp / "docs.jsonl"], out_dir=tmp / "corpus",
                                  shard_tokens=1000, progress=False))
    return tmp, model_dir, tmp / "corpus"


_LOOP_FIELDS = {f.name for f in dataclasses.fields(LoopConfig)}
_OPTIM_FIELDS = {f.name for f in dataclasses.fields(OptimConfig)}


def _cfg(setup, out, **kw):
    """A PretrainConfig; loop and optimizer fields may be given flat, as keywords of their own."""
    tmp, model_dir, corpus = setup
    base = dict(model=model_dir, corpus=corpus, out_dir=tmp / out, max_steps=6, seq_len=16, batch_size=4, lr=3e-3,
                warmup_ratio=0.1, heldout_fraction=0.1, eval_windows=8, log_every=1, device="cpu",
                distributed="none", progress=False)
    base.update(kw)
    loop = LoopConfig(**{k: base.pop(k) for k in list(base) if k in _LOOP_FIELDS})
    optim = OptimConfig(**{k: base.pop(k) for k in list(base) if k in _OPTIM_FIELDS})
    return PretrainConfig(loop=loop, optim=optim, **base)


def test_pretraining_lowers_heldout_perplexity_and_saves_hf_model(setup):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = run(_cfg(setup, "learn", max_steps=30, eval_every=15, save_every=15))
    assert result.final_ppl < 0.5 * result.initial_ppl
    evals = [r for r in read_metrics(result.train.out_dir / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 15, 30] and evals[0]["eval_ppl"] == result.initial_ppl
    assert result.plot_path.is_file() and result.tokens_per_s > 0
    final = result.final_dir
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    info = json.loads((final / "pretrain_info.json").read_text())
    assert info["heldout_tokens_range"][0] == info["train_tokens_range"][1]
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.num_hidden_layers == 2
    AutoTokenizer.from_pretrained(final)
    # Perplexity of the reloaded model equals the last evaluation (weights saved faithfully).
    task = PretrainTask(_cfg(setup, "learn"))
    assert task.evaluate(model.eval())["eval_ppl"] == pytest.approx(result.final_ppl, rel=1e-5)


def test_resume_is_exact(setup):
    tmp = setup[0]
    straight = run(_cfg(setup, "straight", max_steps=4, save_every=2))
    run(_cfg(setup, "resumed", max_steps=4, save_every=2))
    out = tmp / "resumed"
    shutil.rmtree(out / "checkpoints" / "step-4")     # as if killed between steps 2 and 4
    shutil.rmtree(out / "final")
    again = run(_cfg(setup, "resumed", max_steps=4, save_every=2, resume=True))
    assert again.train.resumed_from.name == "step-2" and again.initial_ppl is None
    a = load_file(str(straight.final_dir / "model.safetensors"))
    b = load_file(str(again.final_dir / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(CheckpointError, match="--seq-len: checkpoint 16, now 8"):
        run(_cfg(setup, "resumed", max_steps=4, save_every=2, resume=True, seq_len=8))


def test_windows_are_disjoint_across_ranks_and_steps(setup):
    task = PretrainTask(_cfg(setup, "unused", batch_size=2, grad_accum=2))
    seen = {}
    for step in range(3):
        for micro in range(2):
            for rank in range(2):
                ids = task.batch(step, micro, rank, 2)
                assert ids.shape == (2, 17)
                first = step * 8 + (micro * 2 + rank) * 2
                for k in range(2):
                    start = task.sampler.window_start(first + k)
                    assert start not in seen
                    seen[start] = (step, micro, rank)
                    assert torch.equal(ids[k], torch.from_numpy(task.corpus.tokens(start, 17)))
    assert all(s + 17 <= task.train_range[1] for s in seen)          # never reads the held-out part


def test_ddp_two_processes_match_single_process(setup):
    tmp, model_dir, corpus = setup
    args = ["train", "pretrain", "--model", str(model_dir), "--corpus", str(corpus), "--steps", "3",
            "--seq-len", "16", "--batch-size", "2", "--lr", "3e-3", "--heldout-fraction", "0.1",
            "--eval-windows", "4", "--log-every", "1", "--device", "cpu", "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "osprey_cli.main", *args, "--out", str(tmp / "ddp"), "--distributed", "ddp"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "held-out perplexity" in proc.stdout
    single = CliRunner().invoke(cli, [*args, "--out", str(tmp / "one"), "--distributed", "none",
                                      "--grad-accum", "2"])
    assert single.exit_code == 0, single.output
    a = load_file(str(tmp / "ddp" / "final" / "model.safetensors"))
    b = load_file(str(tmp / "one" / "final" / "model.safetensors"))
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    la = [r["loss"] for r in read_metrics(tmp / "ddp" / "metrics.jsonl") if r["kind"] == "train"]
    lb = [r["loss"] for r in read_metrics(tmp / "one" / "metrics.jsonl") if r["kind"] == "train"]
    assert la == pytest.approx(lb, rel=1e-5)


def test_bad_inputs(setup, tmp_path):
    tmp, model_dir, corpus = setup
    other = tmp_path / "other_model"
    shutil.copytree(model_dir, other)
    make_tiny_tokenizer(other, vocab_size=300)      # same model, different tokenizer
    with pytest.raises(ConfigError, match="tokenize the corpus with --tokenizer"):
        PretrainTask(_cfg(setup, "x", model=other))
    with pytest.raises(InputError, match="no config.json"):
        PretrainTask(_cfg(setup, "x", model=tmp_path))
    with pytest.raises(InputError, match="no index.json"):
        PretrainTask(_cfg(setup, "x", corpus=tmp_path))
    with pytest.raises(InputError, match="too small for windows"):
        PretrainTask(_cfg(setup, "x", seq_len=100_000))
    with pytest.raises(ConfigError, match="heldout_fraction"):
        _cfg(setup, "x", heldout_fraction=0.0)
    with pytest.raises(ConfigError, match="lr"):
        _cfg(setup, "x", lr=-1.0)


def test_cli_tokenize_corpus_and_errors(setup, tmp_path):
    tmp, model_dir, _ = setup
    runner = CliRunner()
    ok = runner.invoke(cli, ["data", "tokenize-corpus", "--tokenizer", str(model_dir), "--input",
                             str(tmp / "docs.jsonl"), "--out", str(tmp_path / "c")])
    assert ok.exit_code == 0, ok.output
    assert "120 documents" in ok.output and (tmp_path / "c" / "index.json").is_file()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"content": "b"}\n')
    res = runner.invoke(cli, ["data", "tokenize-corpus", "--tokenizer", str(model_dir), "--input", str(bad),
                              "--out", str(tmp_path / "d"), "--no-progress"])
    assert res.exit_code == 2 and "bad.jsonl:2: no 'text' field" in res.output
    res = runner.invoke(cli, ["train", "pretrain", "--model", str(model_dir), "--corpus", str(tmp_path / "nope"),
                              "--out", str(tmp_path / "r"), "--device", "cpu"])
    assert res.exit_code == 2 and "no index.json" in res.output


# --- knowledge distillation from the unpruned source (--teacher) -----------------------------------

@pytest.fixture(scope="module")
def teacher_dir(setup, tiny_tokenizer):
    """The 'unpruned source': a deeper tiny Llama with the corpus's tokenizer."""
    return make_tiny_llama(setup[0] / "teacher", tiny_tokenizer, num_layers=4, hidden_size=32, seed=5)


def _naive_kd(student_logits, teacher_logits, targets, tau, weight):
    """The KD loss written out with explicit probabilities, in float64."""
    s = student_logits.double() / tau
    t = teacher_logits.double() / tau
    p = torch.exp(t) / torch.exp(t).sum(-1, keepdim=True)
    q = torch.exp(s) / torch.exp(s).sum(-1, keepdim=True)
    kl = (p * (torch.log(p) - torch.log(q))).sum(-1).mean() * tau * tau
    logq1 = torch.log(torch.softmax(student_logits.double(), -1))
    ce = -logq1.gather(-1, targets[..., None]).squeeze(-1).mean()
    return weight * kl + (1 - weight) * ce


@pytest.mark.parametrize("tau,weight", [(1.0, 1.0), (2.0, 0.7)])
def test_kd_loss_equals_a_naive_reference(setup, teacher_dir, tau, weight):
    from transformers import AutoModelForCausalLM

    task = PretrainTask(_cfg(setup, "kd-ref", teacher=str(teacher_dir), kd_temperature=tau, kd_weight=weight))
    torch.manual_seed(0)
    model = task.build_model()
    batch = task.batch(0, 0, 0, 1)
    loss, metrics = task.loss(model, batch)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        s = model(input_ids=batch[:, :-1]).logits
        t = teacher(input_ids=batch[:, :-1]).logits
    ref = _naive_kd(s, t, batch[:, 1:], tau, weight)
    assert float(loss.detach()) == pytest.approx(float(ref), rel=1e-5)
    assert metrics["kd"] > 0 and metrics["tokens"] == batch[:, 1:].numel()
    loss.backward()   # the student gets gradients, the teacher none
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert all(p.grad is None for p in task.teacher.parameters())
    ev = task.evaluate(model.eval())
    assert set(ev) >= {"eval_ppl", "eval_kd", "teacher_eval_ppl"} and ev["eval_kd"] > 0


def test_kd_pretraining_resumes_exactly_and_records_the_teacher(setup, teacher_dir):
    tmp = setup[0]
    kd = dict(teacher=str(teacher_dir), kd_temperature=2.0, max_steps=4, save_every=2, eval_every=2)
    straight = run(_cfg(setup, "kd-straight", **kd))
    run(_cfg(setup, "kd-resumed", **kd))
    out = tmp / "kd-resumed"
    shutil.rmtree(out / "checkpoints" / "step-4")
    shutil.rmtree(out / "final")
    again = run(_cfg(setup, "kd-resumed", resume=True, **kd))
    assert again.train.resumed_from.name == "step-2"
    a = load_file(str(straight.final_dir / "model.safetensors"))
    b = load_file(str(again.final_dir / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    info = json.loads((straight.final_dir / "pretrain_info.json").read_text())
    assert info["teacher"] == str(teacher_dir) and info["kd_temperature"] == 2.0
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4] and len({r["teacher_eval_ppl"] for r in evals}) == 1
    # a plain run of the same folder would silently change the objective: refused
    with pytest.raises(CheckpointError, match="teacher"):
        run(_cfg(setup, "kd-resumed", resume=True, max_steps=4, save_every=2, eval_every=2))


def test_kd_learns_faster_than_plain_on_the_tiny_corpus(setup, teacher_dir):
    """Soft targets carry more signal per token: after the same steps, lower held-out perplexity
    than with the one-hot next token (the teacher here is trained first so it knows the corpus)."""
    trained_teacher = run(_cfg(setup, "teacher-train", model=teacher_dir, max_steps=40, lr=5e-3)).final_dir
    plain = run(_cfg(setup, "kd-vs-plain", max_steps=8, lr=3e-3))
    soft = run(_cfg(setup, "kd-vs-kd", max_steps=8, lr=3e-3, teacher=str(trained_teacher)))
    assert soft.final_ppl < plain.final_ppl


def test_kd_bad_inputs(setup, tmp_path, teacher_dir):
    other = tmp_path / "other"
    shutil.copytree(teacher_dir, other)
    make_tiny_tokenizer(other, vocab_size=300)
    with pytest.raises(ConfigError, match="must be the unpruned source"):
        PretrainTask(_cfg(setup, "x", teacher=str(other)))
    with pytest.raises(ConfigError, match="need --teacher"):
        _cfg(setup, "x", kd_temperature=2.0)
    with pytest.raises(ConfigError, match="kd_weight"):
        _cfg(setup, "x", teacher=str(teacher_dir), kd_weight=1.5)
    res = CliRunner().invoke(cli, ["train", "pretrain", "--model", str(setup[1]), "--corpus", str(setup[2]),
                                   "--out", str(tmp_path / "r"), "--kd-temperature", "0", "--teacher",
                                   str(teacher_dir)])
    assert res.exit_code == 2 and "kd_temperature must be > 0" in res.output

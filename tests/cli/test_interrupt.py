"""SIGINT / SIGTERM at a random point of every long command (issue #25, item 1).

Each test runs the real command in a subprocess with its units of work slowed down
(``tests.helpers.slow_steps``), sends the signal after a random number of units has started,
and checks the common contract: exit 128 + N, one ``interrupted:`` line saying what was kept and
how to resume, no traceback, no ``Aborted!``; then it resumes and compares the result, bit for
bit, with an uninterrupted run. The random point is drawn from a seeded generator printed in
every assertion message, so a failure can be replayed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from osprey_cli.main import cli
from osprey_data.corpus import TokenizeCorpusConfig
from osprey_data.corpus import run as tokenize
from tests.helpers.tiny import _CORPUS, make_tiny_llama
from tests.train.evaluation.store_util import make_drafter_dir, make_store

REPO = Path(__file__).resolve().parents[2]
SIGNALS = [signal.SIGINT, signal.SIGTERM]


def interrupt(args: list[str], log: Path, *, after_units: int, signum: int, sleep: float = 0.25,
              timeout: float = 120, into_work: bool = True) -> tuple[int, str]:
    """Run ``osprey ARGS`` slowed down; send ``signum`` once ``after_units`` units have started,
    plus a random fraction of one unit (``into_work``: up to half a unit past its wait, into the
    work; otherwise always inside the wait, for a command whose last unit ends the interruptible
    part). Returns (exit code, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OSPREY_TEST_UNIT_LOG": str(log),
           "OSPREY_TEST_UNIT_SLEEP": str(sleep), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.slow_steps", "osprey_cli.main", *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= after_units:
            break
        time.sleep(0.01)
    time.sleep(random.uniform(0, sleep * (1.5 if into_work else 0.8)))
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def assert_one_interrupted_line(rc: int, err: str, signum: int, where: str) -> str:
    assert rc == 128 + signum, (where, rc, err)
    assert "Traceback" not in err and "Aborted!" not in err, (where, err)
    lines = [line for line in err.splitlines() if line.startswith("interrupted: ")]
    assert len(lines) == 1, (where, err)
    assert f"by {signal.Signals(signum).name}" in lines[0], (where, lines[0])
    return lines[0]


def same_weights(a: Path, b: Path) -> None:
    files = sorted(p.name for p in a.glob("*.safetensors"))
    assert files and files == sorted(p.name for p in b.glob("*.safetensors"))
    for name in files:
        wa, wb = load_file(str(a / name)), load_file(str(b / name))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), name


def invoke(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


# --- the trainers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def distill_setup(tmp_path_factory, tiny_llama_dir):
    root = tmp_path_factory.mktemp("distill_interrupt")
    store = make_store(root / "store", tiny_llama_dir, num_samples=4, max_new_tokens=8)
    return make_drafter_dir(root / "drafter", store=store), store


STEPS = 6


def _distill_args(setup, out: Path) -> list[str]:
    drafter, store = setup
    return ["train", "distill", "--drafter", str(drafter), "--store", str(store), "--out", str(out),
            "--steps", str(STEPS), "--ttt-steps", "2", "--tokens-per-batch", "64", "--device", "cpu",
            "--no-progress", "--attention", "sdpa", "--log-every", "2", "--eval-samples", "2"]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_distill_keeps_a_checkpoint_and_resumes_bit_identically(distill_setup, tmp_path, signum):
    seed = random.randrange(10**6)
    random.seed(seed)
    where = f"seed {seed}"
    invoke(_distill_args(distill_setup, tmp_path / "ref"))
    out = tmp_path / "run"
    rc, err = interrupt(_distill_args(distill_setup, out), tmp_path / "log", signum=signum,
                        after_units=random.randint(1, STEPS - 2))
    line = assert_one_interrupted_line(rc, err, signum, where)
    assert "checkpoint" in line and "--resume" in line, (where, line)
    kept = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step-")]
    assert len(kept) == 1 and f"after step {kept[0][5:]} of {STEPS}" in line, (where, kept, line)
    assert not (out / "final").exists()
    invoke([*_distill_args(distill_setup, out), "--resume"])
    same_weights(tmp_path / "ref" / "final", out / "final")


def test_resume_on_a_folder_without_checkpoint_is_an_error(distill_setup, tmp_path):
    result = CliRunner().invoke(cli, [*_distill_args(distill_setup, tmp_path / "new"), "--resume"])
    assert result.exit_code == 2 and "holds no complete checkpoint" in result.output
    assert "--resume-if-any" in result.output
    invoke([*_distill_args(distill_setup, tmp_path / "new"), "--resume-if-any", "--steps", "1"])


@pytest.fixture(scope="module")
def pretrain_setup(tmp_path_factory, tiny_tokenizer):
    tmp = tmp_path_factory.mktemp("pretrain_interrupt")
    model_dir = make_tiny_llama(tmp / "model", tiny_tokenizer, num_layers=2, hidden_size=32)
    docs = [f"{_CORPUS[i % len(_CORPUS)]} {_CORPUS[(3 * i + 1) % len(_CORPUS)]}" for i in range(60)]
    (tmp / "docs.jsonl").write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
    tokenize(TokenizeCorpusConfig(tokenizer=str(model_dir), inputs=[tmp / "docs.jsonl"], out_dir=tmp / "corpus",
                                  shard_tokens=1000, progress=False))
    return model_dir, tmp / "corpus"


def _pretrain_args(setup, out: Path) -> list[str]:
    model, corpus = setup
    return ["train", "pretrain", "--model", str(model), "--corpus", str(corpus), "--out", str(out),
            "--steps", str(STEPS), "--seq-len", "16", "--batch-size", "2", "--eval-windows", "4",
            "--heldout-fraction", "0.1", "--eval-every", "3", "--device", "cpu", "--no-progress",
            "--distributed", "none"]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_pretrain_keeps_a_checkpoint_and_resumes_bit_identically(pretrain_setup, tmp_path, signum):
    seed = random.randrange(10**6)
    random.seed(seed)
    where = f"seed {seed}"
    invoke(_pretrain_args(pretrain_setup, tmp_path / "ref"))
    out = tmp_path / "run"
    rc, err = interrupt(_pretrain_args(pretrain_setup, out), tmp_path / "log", signum=signum,
                        after_units=random.randint(1, STEPS - 2))
    line = assert_one_interrupted_line(rc, err, signum, where)
    assert "checkpoint" in line and "--resume" in line, (where, line)
    invoke([*_pretrain_args(pretrain_setup, out), "--resume"])
    same_weights(tmp_path / "ref" / "final", out / "final")


# --- the offline evaluations -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eval_setup(distill_setup, tmp_path_factory):
    drafter, store = distill_setup
    return drafter, make_drafter_dir(tmp_path_factory.mktemp("second") / "d", seed=5, store=store), store


def _matrix_args(setup, out: Path) -> list[str]:
    d1, d2, store = setup
    return ["eval", "matrix", "--drafter", f"a={d1}", "--drafter", f"b={d2}", "--store", f"a={store}",
            "--store", f"c={store}", "--steps", "2", "--device", "cpu", "--out", str(out)]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_matrix_keeps_finished_cells_and_continues(eval_setup, tmp_path, signum):
    seed = random.randrange(10**6)
    random.seed(seed)
    where = f"seed {seed}"
    invoke(_matrix_args(eval_setup, tmp_path / "ref"))
    out = tmp_path / "run"
    rc, err = interrupt(_matrix_args(eval_setup, out), tmp_path / "log", signum=signum,
                        after_units=random.randint(1, 3))
    line = assert_one_interrupted_line(rc, err, signum, where)
    assert "Rerun the same command to continue" in line and not (out / "matrix.json").exists(), (where, line)
    partial = out / "matrix.partial.json"
    kept = len(json.loads(partial.read_text())["cells"]) if partial.exists() else 0
    assert (f"{kept} of 4 cells finished" in line) if kept else ("none of its 4 cells" in line), (where, line)
    assert kept < 4, where
    invoke(_matrix_args(eval_setup, out))
    assert not partial.exists()
    assert json.loads((out / "matrix.json").read_text()) == json.loads((tmp_path / "ref" / "matrix.json").read_text())


def test_matrix_ignores_cells_of_another_matrix(eval_setup, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "matrix.partial.json").write_text(json.dumps({"identity": {"steps": 9}, "cells": {"0,0": {
        "overall": 99.0, "proxy": False}}}))
    invoke(_matrix_args(eval_setup, out))
    assert 99.0 not in json.loads((out / "matrix.json").read_text())["values"][0]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_sweep_says_nothing_was_finished(eval_setup, tmp_path, signum):
    d1, _, store = eval_setup
    args = ["eval", "sweep", "--drafter", str(d1), "--store", str(store), "--out", str(tmp_path / "s"),
            "--tree", "2,2,4", "--threads", "1", "--device", "cpu", "--json"]
    # one unit (the whole pass): a signal after it ends would find the results being written
    rc, err = interrupt(args, tmp_path / "log", signum=signum, after_units=1, sleep=3, into_work=False)
    line = assert_one_interrupted_line(rc, err, signum, "sweep")
    assert "nothing was written" in line and not (tmp_path / "s" / "sweep.json").exists()
